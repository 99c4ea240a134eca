// Endpoints as the provider sees them, independent of loom's own counting: every tcp;ofi_rxm
// endpoint listens on a TCP socket; every shm endpoint owns a /dev/shm/<pid>:... region.
#pragma once

#include <cstddef>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include <dirent.h>
#include <unistd.h>

namespace loom::test {

inline std::size_t shm_regions_of_this_process() {
  const std::string prefix = std::to_string(getpid()) + ":";
  std::size_t count = 0;
  if (DIR* dir = opendir("/dev/shm")) {
    while (dirent* entry = readdir(dir)) {
      if (std::string(entry->d_name).rfind(prefix, 0) == 0) ++count;
    }
    closedir(dir);
  }
  return count;
}

inline std::size_t listening_sockets_of_this_process() {
  std::set<std::string> listening;  // socket inodes in state LISTEN (0A)
  for (const char* table : {"/proc/self/net/tcp", "/proc/self/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      std::string slot, local, remote, state, queues, timer, retransmit, uid, timeout, inode;
      fields >> slot >> local >> remote >> state >> queues >> timer >> retransmit >> uid >>
          timeout >> inode;
      if (state == "0A") listening.insert(inode);
    }
  }
  std::size_t count = 0;
  if (DIR* dir = opendir("/proc/self/fd")) {
    while (dirent* entry = readdir(dir)) {
      char target[256] = {};
      std::string path = std::string("/proc/self/fd/") + entry->d_name;
      ssize_t n = readlink(path.c_str(), target, sizeof target - 1);
      if (n <= 0) continue;
      std::string link(target, static_cast<std::size_t>(n));
      if (link.rfind("socket:[", 0) == 0 && listening.count(link.substr(8, link.size() - 9)) != 0) {
        ++count;
      }
    }
    closedir(dir);
  }
  return count;
}

// What the provider under test holds: shm regions for shm, listening sockets otherwise.
inline std::size_t provider_endpoints(const std::string& provider) {
  return provider == "shm" ? shm_regions_of_this_process() : listening_sockets_of_this_process();
}

}  // namespace loom::test
