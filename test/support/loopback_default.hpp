// A test binary run by hand without the meson matrix's environment uses tcp on the loopback
// interface, never the first interface libfabric lists (tests stay on 127.0.0.0/8).
#pragma once

#include <cstdlib>

namespace loom::test {

inline void default_to_loopback_tcp() {
  if (std::getenv("LOOM_PROVIDER") == nullptr) {
    setenv("LOOM_PROVIDER", "tcp", 1);
    setenv("LOOM_NICS", "lo", 1);
    setenv("FI_PROVIDER", "tcp", 1);
  }
}

}  // namespace loom::test
