// Everything a user of loom includes.
#pragma once

#include "loom/config.hpp"
#include "loom/error.hpp"
#include "loom/log.hpp"
#include "loom/memory.hpp"
#include "loom/p2p.hpp"
#include "loom/process.hpp"
#include "loom/rma.hpp"
