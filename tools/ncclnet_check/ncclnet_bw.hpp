// ncclnet_check's bandwidth mode (see ncclnet_bw.cpp).
#pragma once

#include <chrono>
#include <cstddef>
#include <string>
#include <vector>

namespace ncclnet {

struct BwOptions {
  std::string plugin;
  int version = 0;
  int dev = 0;
  std::vector<std::size_t> sizes;
  std::size_t iterations = 0;  // 0: 20000/2000/200 by size, as fabtests and fi_p2p_bw
  std::size_t warmup = 10;
  std::size_t window = 64;
  std::string json;
  std::vector<int> pin;  // cores: the server's (rank 1), then the client's (rank 0)
  std::chrono::seconds timeout{600};
};

std::size_t default_iterations(std::size_t size);

// Forks a client and a server, prints fabtests' columns, writes JSON when asked. Returns an
// empty string, or the error.
std::string run_bandwidth(const BwOptions& options);

}  // namespace ncclnet
