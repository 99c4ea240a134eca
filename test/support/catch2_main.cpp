// Catch2's main, plus one safety net: a test binary run by hand without the meson matrix's
// environment uses tcp on the loopback interface, never the first interface libfabric lists.
#define CATCH_CONFIG_RUNNER
#include <cstdlib>

#include <catch2/catch.hpp>

int main(int argc, char** argv) {
  if (std::getenv("LOOM_PROVIDER") == nullptr) {
    setenv("LOOM_PROVIDER", "tcp", 1);
    setenv("LOOM_NICS", "lo", 1);
    setenv("FI_PROVIDER", "tcp", 1);
  }
  return Catch::Session().run(argc, argv);
}
