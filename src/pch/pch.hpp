// Precompiled header: the heavy, stable headers most translation units use.
#pragma once

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
