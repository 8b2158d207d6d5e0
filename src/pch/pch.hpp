// Precompiled header: the heavy, stable headers most translation units use.
// An include guard, not #pragma once: GCC warns about the latter when it
// compiles the header itself into the precompiled header.
#ifndef CUBICLE_PCH_HPP
#define CUBICLE_PCH_HPP

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <fmt/format.h>
#include <simdjson.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#endif
