// Catch2's main, with the loopback default for a binary run by hand (loopback_default.hpp).
#define CATCH_CONFIG_RUNNER
#include <cstdlib>

#include <catch2/catch.hpp>

#include "loopback_default.hpp"

int main(int argc, char** argv) {
  loom::test::default_to_loopback_tcp();
  return Catch::Session().run(argc, argv);
}
