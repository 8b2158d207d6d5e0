/* The egress proxy's TLS termination for hosts that carry secrets (proxy_tls.h). */
#include "proxy_tls.h"
#include "proxy_framing.h"
#include "proxy_secrets.h"

#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#define MAX_CAS     1024
#define HEAD_MAX    (16 * 1024)          /* a request head, as in proxy.c */
#define HEAD_CAP    (HEAD_MAX + 40 * 1024)   /* and room for the secrets put in */
#define LINE_MAX_   1024                 /* a chunk-size or trailer line */
#define STEP_MS     30000                /* a handshake or a write may take this long (a loaded machine: seen over 10 s) */
#define IDLE_MS     300000               /* a connection idle this long is closed */

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static SSL_CTX *to_host, *to_sandbox;   /* made on first use, under lock */
static EVP_PKEY *leaf_key;              /* one key for every certificate we mint */
static struct ca { char client[48]; X509 *cert; EVP_PKEY *key; } cas[MAX_CAS];
static int ncas;
/* The last TLS session with each host, resumed by the next connection: a new
 * connection through us then costs the sandbox one full handshake, not two. */
#define MAX_SESSIONS 256
static struct { char key[272]; SSL_SESSION *session; } sessions[MAX_SESSIONS];
static unsigned next_session;

/* ---- set-up and commands ---------------------------------------------- */

static int new_session(SSL *ssl, SSL_SESSION *session);

static int alpn_http11(SSL *ssl, const unsigned char **out, unsigned char *outlen,
                       const unsigned char *in, unsigned int inlen, void *arg)
{
    (void)ssl;
    (void)arg;
    for (unsigned int i = 0; i < inlen; i += 1u + in[i])
        if (in[i] == 8 && i + 9 <= inlen && !memcmp(in + i + 1, "http/1.1", 8)) {
            *out = in + i + 1;
            *outlen = 8;
            return SSL_TLSEXT_ERR_OK;
        }
    return SSL_TLSEXT_ERR_NOACK;   /* h2 only: go on without ALPN, in HTTP/1.1 */
}

static int init_locked(void)
{
    if (to_host)
        return 0;
    OPENSSL_init_ssl(OPENSSL_INIT_NO_LOAD_CONFIG, NULL);
    static const unsigned char alpn[] = "\x08http/1.1";
    SSL_CTX *h = SSL_CTX_new(TLS_client_method()), *s = SSL_CTX_new(TLS_server_method());
    EVP_PKEY *k = EVP_EC_gen("P-256");
    if (!h || !s || !k) {
        SSL_CTX_free(h);
        SSL_CTX_free(s);
        EVP_PKEY_free(k);
        return -1;
    }
    SSL_CTX_set_min_proto_version(h, TLS1_2_VERSION);
    SSL_CTX_set_min_proto_version(s, TLS1_2_VERSION);
    SSL_CTX_set_verify(h, SSL_VERIFY_PEER, NULL);   /* always: there is no switch */
    SSL_CTX_set_alpn_protos(h, alpn, sizeof alpn - 1);
    SSL_CTX_set_alpn_select_cb(s, alpn_http11, NULL);
    SSL_CTX_set_mode(h, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    SSL_CTX_set_session_cache_mode(h, SSL_SESS_CACHE_CLIENT | SSL_SESS_CACHE_NO_INTERNAL_STORE);
    SSL_CTX_sess_set_new_cb(h, new_session);
    SSL_CTX_set_mode(s, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    to_host = h;
    to_sandbox = s;
    leaf_key = k;
    return 0;
}

static int unhex_digit(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* The hex word at *p (up to a space or the end) as a memory BIO; NULL if bad. */
static BIO *hex_bio(const char **p, char **keep, size_t *len)
{
    const char *s = *p;
    while (*s == ' ')
        s++;
    size_t n = strcspn(s, " ");
    if (!n || n % 2)
        return NULL;
    char *buf = malloc(n / 2);
    if (!buf)
        return NULL;
    for (size_t i = 0; i < n; i += 2) {
        int hi = unhex_digit(s[i]), lo = unhex_digit(s[i + 1]);
        if (hi < 0 || lo < 0) {
            free(buf);
            return NULL;
        }
        buf[i / 2] = (char)(hi << 4 | lo);
    }
    *p = s + n;
    *keep = buf;
    *len = n / 2;
    return BIO_new_mem_buf(buf, (int)(n / 2));
}

static void drop_ca(int i)
{
    X509_free(cas[i].cert);
    EVP_PKEY_free(cas[i].key);
    cas[i] = cas[--ncas];
}

int tls_command(const char *line)
{
    char verb[8], client[48];
    int used = 0, rc = -1;
    if (sscanf(line, "%7s %n", verb, &used) != 1)
        return -1;
    const char *p = line + used;
    pthread_mutex_lock(&lock);
    if (init_locked())
        goto out;
    if (!strcmp(verb, "trust")) {
        char *buf = NULL;
        size_t len = 0;
        BIO *b = hex_bio(&p, &buf, &len);
        X509 *x = b ? PEM_read_bio_X509(b, NULL, NULL, NULL) : NULL;
        if (x && X509_STORE_add_cert(SSL_CTX_get_cert_store(to_host), x) == 1)
            rc = 0;
        X509_free(x);
        BIO_free(b);
        free(buf);
    } else if (!strcmp(verb, "ca") || !strcmp(verb, "unca")) {
        if (sscanf(p, "%47s %n", client, &used) != 1)
            goto out;
        p += used;
        for (int i = ncas - 1; i >= 0; i--)
            if (!strcmp(cas[i].client, client))
                drop_ca(i);
        if (!strcmp(verb, "unca")) {
            rc = 0;
            goto out;
        }
        char *cbuf = NULL, *kbuf = NULL;
        size_t clen = 0, klen = 0;
        BIO *cb = hex_bio(&p, &cbuf, &clen), *kb = cb ? hex_bio(&p, &kbuf, &klen) : NULL;
        X509 *cert = cb ? PEM_read_bio_X509(cb, NULL, NULL, NULL) : NULL;
        EVP_PKEY *key = kb ? PEM_read_bio_PrivateKey(kb, NULL, NULL, NULL) : NULL;
        if (cert && key && ncas < MAX_CAS) {
            snprintf(cas[ncas].client, sizeof cas[ncas].client, "%s", client);
            cas[ncas].cert = cert;
            cas[ncas].key = key;
            ncas++;
            rc = 0;
        } else {
            X509_free(cert);
            EVP_PKEY_free(key);
        }
        BIO_free(cb);
        BIO_free(kb);
        if (kbuf)
            OPENSSL_cleanse(kbuf, klen);   /* the key's copy */
        free(cbuf);
        free(kbuf);
    }
out:
    pthread_mutex_unlock(&lock);
    return rc;
}

/* ---- minting ----------------------------------------------------------- */

static int add_ext(X509 *cert, X509 *issuer, int nid, const char *value)
{
    X509V3_CTX ctx;
    X509V3_set_ctx(&ctx, issuer, cert, NULL, NULL, 0);
    X509_EXTENSION *ext = X509V3_EXT_conf_nid(NULL, &ctx, nid, value);
    int ok = ext && X509_add_ext(cert, ext, -1);
    X509_EXTENSION_free(ext);
    return ok ? 0 : -1;
}

/* A certificate for host, signed by the client's CA; NULL if it has none. */
static X509 *mint(const char *client, const char *host)
{
    X509 *cert = NULL;
    pthread_mutex_lock(&lock);
    struct ca *ca = NULL;
    for (int i = 0; i < ncas; i++)
        if (!strcmp(cas[i].client, client))
            ca = &cas[i];
    if (!ca)
        goto out;
    unsigned char serial[16];
    char san[300];
    unsigned char ip[16];
    int is_ip = inet_pton(AF_INET, host, ip) == 1 || inet_pton(AF_INET6, host, ip) == 1;
    snprintf(san, sizeof san, "%s:%s", is_ip ? "IP" : "DNS", host);
    cert = X509_new();
    BIGNUM *bn = NULL;
    ASN1_INTEGER *sn = NULL;
    if (!cert || RAND_bytes(serial, sizeof serial) != 1)
        goto bad;
    serial[0] &= 0x7f;
    if (!(bn = BN_bin2bn(serial, sizeof serial, NULL)) || !(sn = BN_to_ASN1_INTEGER(bn, NULL)) ||
        !X509_set_version(cert, 2) || !X509_set_serialNumber(cert, sn) ||
        !X509_gmtime_adj(X509_getm_notBefore(cert), -3600) ||
        !X509_gmtime_adj(X509_getm_notAfter(cert), 7L * 86400) ||
        !X509_set_pubkey(cert, leaf_key) ||
        !X509_set_issuer_name(cert, X509_get_subject_name(ca->cert)))
        goto bad;
    X509_NAME *name = X509_get_subject_name(cert);
    char cn[65];
    size_t cl = strnlen(host, sizeof cn - 1);   /* a CN has at most 64 characters; the SAN has it all */
    memcpy(cn, host, cl);
    cn[cl] = '\0';
    if (!X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, (const unsigned char *)cn, -1, -1, 0) ||
        add_ext(cert, ca->cert, NID_basic_constraints, "critical,CA:FALSE") ||
        add_ext(cert, ca->cert, NID_key_usage, "critical,digitalSignature") ||
        add_ext(cert, ca->cert, NID_ext_key_usage, "serverAuth") ||
        add_ext(cert, ca->cert, NID_subject_alt_name, san) ||
        add_ext(cert, ca->cert, NID_subject_key_identifier, "hash") ||
        add_ext(cert, ca->cert, NID_authority_key_identifier, "keyid:always") ||
        !X509_sign(cert, ca->key, EVP_sha256()))
        goto bad;
    BN_free(bn);
    ASN1_INTEGER_free(sn);
    goto out;
bad:
    BN_free(bn);
    ASN1_INTEGER_free(sn);
    X509_free(cert);
    cert = NULL;
out:
    pthread_mutex_unlock(&lock);
    return cert;
}

static void session_key(char *key, size_t cap, const char *host, int port)
{
    snprintf(key, cap, "%s:%d", host, port);
}

static SSL_SESSION *session_for(const char *host, int port)
{
    char key[272];
    SSL_SESSION *found = NULL;
    session_key(key, sizeof key, host, port);
    pthread_mutex_lock(&lock);
    for (int i = 0; i < MAX_SESSIONS && !found; i++)
        if (sessions[i].session && !strcmp(sessions[i].key, key) && SSL_SESSION_is_resumable(sessions[i].session)) {
            found = sessions[i].session;
            SSL_SESSION_up_ref(found);
        }
    pthread_mutex_unlock(&lock);
    return found;
}

static void keep_session(const char *host, int port, SSL_SESSION *session)
{
    char key[272];
    if (!session)
        return;
    session_key(key, sizeof key, host, port);
    pthread_mutex_lock(&lock);
    int slot = -1;
    for (int i = 0; i < MAX_SESSIONS && slot < 0; i++)
        if (sessions[i].session && !strcmp(sessions[i].key, key))
            slot = i;
    if (slot < 0)
        slot = (int)(next_session++ % MAX_SESSIONS);
    SSL_SESSION_free(sessions[slot].session);
    snprintf(sessions[slot].key, sizeof sessions[slot].key, "%s", key);
    sessions[slot].session = session;
    pthread_mutex_unlock(&lock);
}


/* ---- I/O ---------------------------------------------------------------- */

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Waits for what an SSL call wants (ret its result); 0 to call again, -1 on failure. */
static int wait_for(SSL *ssl, int fd, int ret, int64_t deadline)
{
    int err = SSL_get_error(ssl, ret);
    short ev = err == SSL_ERROR_WANT_READ ? POLLIN : err == SSL_ERROR_WANT_WRITE ? POLLOUT : 0;
    if (!ev)
        return -1;
    int64_t left = deadline - now_ms();
    struct pollfd p = { fd, ev, 0 };
    return left > 0 && poll(&p, 1, (int)left) == 1 ? 0 : -1;
}

static int handshake(SSL *ssl, int fd, int accept)
{
    int64_t deadline = now_ms() + STEP_MS;
    for (;;) {
        int r = accept ? SSL_accept(ssl) : SSL_connect(ssl);
        if (r == 1)
            return 0;
        if (wait_for(ssl, fd, r, deadline))
            return -1;
    }
}

static int write_all(SSL *ssl, int fd, const char *p, size_t n)
{
    int64_t deadline = now_ms() + STEP_MS;
    while (n) {
        int w = SSL_write(ssl, p, n > (1 << 30) ? 1 << 30 : (int)n);
        if (w > 0) {
            p += w;
            n -= (size_t)w;
            deadline = now_ms() + STEP_MS;
        } else if (wait_for(ssl, fd, w, deadline)) {
            return -1;
        }
    }
    return 0;
}

/* Plain bytes to the sandbox before TLS starts (the CONNECT answer). */
static int send_plain(int fd, const char *p, size_t n)
{
    int64_t deadline = now_ms() + STEP_MS;
    while (n) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w > 0) {
            p += w;
            n -= (size_t)w;
            continue;
        }
        if (w < 0 && errno != EAGAIN && errno != EINTR)
            return -1;
        struct pollfd q = { fd, POLLOUT, 0 };
        int64_t left = deadline - now_ms();
        if (left <= 0 || poll(&q, 1, (int)left) < 0)
            return -1;
    }
    return 0;
}

/* ---- requests ----------------------------------------------------------- */

enum fstate { F_HEAD, F_BODY, F_CHUNK_SIZE, F_CHUNK_DATA, F_CHUNK_END, F_TRAILER };

struct job {
    int slot, cfd, ufd, notify_fd, port;
    char client[48], host[256];
    SSL *up, *down;
    struct tls_outcome *r;
    /* the request stream from the sandbox */
    enum fstate st;
    char head[HEAD_CAP];
    size_t hl;
    uint64_t left;
    char line[LINE_MAX_ + 1];
    size_t ll;
};

/* A session (a TLS 1.3 ticket as soon as it comes, in the first response) is kept at
 * once, not when the connection ends: the next connection to the host, often opened
 * before this one closes, resumes it. The reference is ours (returns 1). */
static int new_session(SSL *ssl, SSL_SESSION *session)
{
    const struct job *j = SSL_get_app_data(ssl);
    if (!j)
        return 0;
    keep_session(j->host, j->port, session);
    return 1;
}

static void add_names(char *list, size_t cap, const char *names)
{
    char copy[256];
    snprintf(copy, sizeof copy, "%s", names);
    for (char *save = NULL, *n = strtok_r(copy, ",", &save); n; n = strtok_r(NULL, ",", &save)) {
        size_t len = strlen(list), nl = strlen(n);
        int have = 0;
        for (const char *q = list; (q = strstr(q, n)); q += nl)
            if ((q == list || q[-1] == ',') && (q[nl] == ',' || !q[nl]))
                have = 1;
        if (!have && len + nl + 2 <= cap) {
            if (len)
                list[len++] = ',';
            memcpy(list + len, n, nl + 1);
        }
    }
}

static int upstream_write(struct job *j, const char *p, size_t n)
{
    if (write_all(j->up, j->ufd, p, n)) {
        snprintf(j->r->error, sizeof j->r->error, "the host stopped taking the request");
        return -1;
    }
    j->r->out += n;
    return 0;
}

/* A request we will not pass on: the sandbox gets 400 and the reason; nothing went upstream. */
static int refuse(struct job *j, const char *why)
{
    char msg[400];
    int n = snprintf(msg, sizeof msg, "HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain\r\n"
                     "Connection: close\r\nContent-Length: %zu\r\n\r\n%s\n", strlen(why) + 1, why);
    snprintf(j->r->error, sizeof j->r->error, "%s", why);
    OPENSSL_cleanse(j->head, sizeof j->head);
    j->hl = 0;
    write_all(j->down, j->cfd, msg, (size_t)n);
    return -1;
}

/* A complete head in j->head: checked (proxy_framing.h), the sandbox's secrets go in,
 * then it goes upstream. */
static int pass_head(struct job *j)
{
    struct request_framing f;
    const char *why = framing_check_head(j->head, j->hl, j->host, j->port, &f);
    if (why)
        return refuse(j, why);
    char injected[256], flagged[256];
    if (secrets_rewrite(j->client, j->host, j->port, 1, j->head, &j->hl, sizeof j->head, injected,
                        sizeof injected, flagged, sizeof flagged)) {
        snprintf(j->r->error, sizeof j->r->error, "request head too long");
        return -1;
    }
    add_names(j->r->secrets, sizeof j->r->secrets, injected);
    add_names(j->r->placeholders, sizeof j->r->placeholders, flagged);
    j->r->requests++;
    int rc = upstream_write(j, j->head, j->hl);
    OPENSSL_cleanse(j->head, j->hl);   /* it held the values */
    j->hl = 0;
    j->st = f.chunked ? F_CHUNK_SIZE : f.length ? F_BODY : F_HEAD;
    j->left = f.chunked ? 0 : f.length;
    return rc;
}

/* Bytes from the sandbox: heads rewritten, bodies passed as they are framed. */
static int feed(struct job *j, const char *p, size_t n)
{
    while (n) {
        if (j->st == F_HEAD) {
            size_t take = n < HEAD_MAX - j->hl ? n : HEAD_MAX - j->hl;
            size_t from = j->hl > 3 ? j->hl - 3 : 0;
            memcpy(j->head + j->hl, p, take);
            char *end = memmem(j->head + from, j->hl + take - from, "\r\n\r\n", 4);
            if (!end) {
                j->hl += take;
                p += take;
                n -= take;
                if (j->hl == HEAD_MAX) {
                    snprintf(j->r->error, sizeof j->r->error, "request head over 16 KiB");
                    return -1;
                }
                continue;
            }
            size_t used = (size_t)(end + 4 - j->head) - j->hl;
            j->hl += used;
            p += used;
            n -= used;
            if (pass_head(j))
                return -1;
        } else if (j->st == F_BODY || j->st == F_CHUNK_DATA) {
            size_t take = n < j->left ? n : (size_t)j->left;
            if (upstream_write(j, p, take))
                return -1;
            p += take;
            n -= take;
            j->left -= take;
            if (!j->left)
                j->st = j->st == F_BODY ? F_HEAD : F_CHUNK_END;
        } else {   /* a chunk-size line, the CRLF after chunk data, or a trailer line */
            const char *nl = memchr(p, '\n', n);
            size_t take = nl ? (size_t)(nl + 1 - p) : n;
            if (j->ll + take > LINE_MAX_) {
                snprintf(j->r->error, sizeof j->r->error, "bad chunked request body");
                return -1;
            }
            memcpy(j->line + j->ll, p, take);
            j->ll += take;
            p += take;
            n -= take;
            if (!nl)
                continue;
            j->line[j->ll] = '\0';
            /* checked before any of it goes upstream */
            uint64_t size = 0;
            int ok = j->ll >= 2 && !memcmp(j->line + j->ll - 2, "\r\n", 2);
            if (j->st == F_CHUNK_END)
                ok = ok && j->ll == 2;
            else if (j->st == F_TRAILER)
                ok = ok && !memchr(j->line, '\r', j->ll - 2) && (j->ll == 2 || (j->line[0] != ' ' && j->line[0] != '\t'));
            else
                ok = !framing_chunk_size(j->line, j->ll, &size);
            if (!ok) {
                snprintf(j->r->error, sizeof j->r->error, "bad chunked request body");
                return -1;
            }
            if (upstream_write(j, j->line, j->ll))
                return -1;
            if (j->st == F_CHUNK_END)
                j->st = F_CHUNK_SIZE;
            else if (j->st == F_TRAILER) {
                if (j->ll == 2)
                    j->st = F_HEAD;
            } else {
                j->st = size ? F_CHUNK_DATA : F_TRAILER;
                j->left = size;
            }
            j->ll = 0;
        }
    }
    return 0;
}

/* Both ways until either side ends.  Returns when done. */
static void relay(struct job *j)
{
    char buf[16384];
    /* what each side's last SSL_read waits for: a read may need to write first (a key
     * update, a renegotiation); polling for input alone would then stall until idle */
    short want_down = POLLIN, want_up = POLLIN;
    for (;;) {
        int ready = SSL_pending(j->down) > 0 || SSL_pending(j->up) > 0;
        struct pollfd p[2] = { { j->cfd, want_down, 0 }, { j->ufd, want_up, 0 } };
        int n = poll(p, 2, ready ? 0 : IDLE_MS);
        if (n < 0 && errno != EINTR)
            return;
        if (n == 0 && !ready)
            return;   /* idle */
        if ((p[0].revents || SSL_pending(j->down) > 0)) {
            int r = SSL_read(j->down, buf, sizeof buf);
            want_down = POLLIN;
            if (r > 0) {
                if (feed(j, buf, (size_t)r))
                    return;
            } else {
                int err = SSL_get_error(j->down, r);
                if (err != SSL_ERROR_WANT_READ && err != SSL_ERROR_WANT_WRITE)
                    return;   /* the sandbox is done */
                if (err == SSL_ERROR_WANT_WRITE)
                    want_down = POLLOUT;
            }
        }
        if ((p[1].revents || SSL_pending(j->up) > 0)) {
            int r = SSL_read(j->up, buf, sizeof buf);
            want_up = POLLIN;
            if (r > 0) {
                j->r->in += (uint64_t)r;
                if (write_all(j->down, j->cfd, buf, (size_t)r))
                    return;
            } else {
                int err = SSL_get_error(j->up, r);
                if (err != SSL_ERROR_WANT_READ && err != SSL_ERROR_WANT_WRITE)
                    return;   /* the host is done, and the sandbox has it all */
                if (err == SSL_ERROR_WANT_WRITE)
                    want_up = POLLOUT;
            }
        }
    }
}

/* Why the upstream handshake failed, in words for the ledger and the sandbox. */
static void upstream_failure(struct job *j)
{
    long v = SSL_get_verify_result(j->up);
    unsigned long e = ERR_peek_last_error();
    if (v != X509_V_OK)
        snprintf(j->r->error, sizeof j->r->error, "TLS to the host failed: certificate verify failed (%s)",
                 X509_verify_cert_error_string(v));
    else
        snprintf(j->r->error, sizeof j->r->error, "TLS to the host failed: %s",
                 e ? ERR_reason_error_string(e) ? ERR_reason_error_string(e) : "handshake error" : "handshake error");
}

static void *run(void *arg)
{
    struct job *j = arg;
    static const char established[] = "HTTP/1.1 200 Connection established\r\n\r\n";
    X509 *leaf = NULL;
    unsigned char ip[16];

    j->up = SSL_new(to_host);
    j->down = SSL_new(to_sandbox);
    if (!j->up || !j->down || !SSL_set_fd(j->up, j->ufd) || !SSL_set_fd(j->down, j->cfd)) {
        snprintf(j->r->error, sizeof j->r->error, "out of memory");
        goto done;
    }
    SSL_set_app_data(j->up, j);   /* new_session: which host a ticket is for */
    /* without the name (or address) to check, any trusted certificate would pass: give up */
    int named = inet_pton(AF_INET, j->host, ip) == 1 || inet_pton(AF_INET6, j->host, ip) == 1
                    ? X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(j->up), j->host) == 1
                    : SSL_set_tlsext_host_name(j->up, j->host) == 1 && SSL_set1_host(j->up, j->host) == 1;
    if (!named) {
        snprintf(j->r->error, sizeof j->r->error, "cannot set the host's name to verify");
        goto done;
    }
    SSL_SESSION *resume = session_for(j->host, j->port);
    if (resume) {
        SSL_set_session(j->up, resume);   /* verified when it was made, for this host */
        SSL_SESSION_free(resume);
    }
    if (handshake(j->up, j->ufd, 0)) {
        upstream_failure(j);
        char msg[400];
        int n = snprintf(msg, sizeof msg, "HTTP/1.1 502 Bad Gateway\r\nContent-Type: text/plain\r\n"
                         "Connection: close\r\n\r\ncubicle proxy: %s:%d: %s\n", j->host, j->port, j->r->error);
        send_plain(j->cfd, msg, (size_t)n < sizeof msg ? (size_t)n : sizeof msg - 1);
        goto done;
    }
    if (!(leaf = mint(j->client, j->host))) {
        snprintf(j->r->error, sizeof j->r->error, "no certificate authority for this sandbox");
        goto done;
    }
    if (!SSL_use_certificate(j->down, leaf) || !SSL_use_PrivateKey(j->down, leaf_key) ||
        send_plain(j->cfd, established, sizeof established - 1))
        goto done;
    if (handshake(j->down, j->cfd, 1)) {
        /* nothing was sent; the ledger says why (a program that does not trust the sandbox's CA) */
        unsigned long e = ERR_peek_last_error();
        snprintf(j->r->error, sizeof j->r->error, "TLS with the sandbox failed: %s",
                 e && ERR_reason_error_string(e) ? ERR_reason_error_string(e) : "no handshake in time");
        goto done;
    }
    relay(j);
    SSL_shutdown(j->down);
    SSL_shutdown(j->up);
done:
    X509_free(leaf);
    SSL_free(j->up);
    SSL_free(j->down);
    struct tls_outcome *r = j->r;
    int fd = j->notify_fd;
    OPENSSL_cleanse(j, sizeof *j);
    free(j);
    if (write(fd, &r, sizeof r) != sizeof r) {
        /* the main loop is gone */
    }
    return NULL;
}

int tls_start(int slot, int cfd, int ufd, const char *client, const char *host, int port, int notify_fd)
{
    pthread_mutex_lock(&lock);
    int ok = init_locked() == 0;
    pthread_mutex_unlock(&lock);
    struct job *j = ok ? calloc(1, sizeof *j) : NULL;
    struct tls_outcome *r = j ? calloc(1, sizeof *r) : NULL;
    if (!r) {
        free(j);
        return -1;
    }
    *j = (struct job){ .slot = slot, .cfd = cfd, .ufd = ufd, .notify_fd = notify_fd, .port = port, .r = r };
    r->slot = slot;
    snprintf(j->client, sizeof j->client, "%s", client);
    snprintf(j->host, sizeof j->host, "%s", host);
    pthread_attr_t attr;
    pthread_t t;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attr, 256 * 1024);
    int err = pthread_create(&t, &attr, run, j);
    pthread_attr_destroy(&attr);
    if (err) {
        free(r);
        free(j);
        return -1;
    }
    return 0;
}
