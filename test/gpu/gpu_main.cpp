// The GPU tests' main: without a GPU (no CUDA in the build, no driver, no device) it prints why
// and exits 77, which meson counts as skipped. TEST_GPU_MEMORY=host runs them on host buffers.
#define CATCH_CONFIG_RUNNER
#include <cstdio>
#include <cstdlib>

#include <catch2/catch.hpp>

#include "gpu/gpu_support.hpp"
#include "support/loopback_default.hpp"

int main(int argc, char** argv) {
  loom::test::default_to_loopback_tcp();
  const std::string missing = loom::test::gpu_missing();
  if (!missing.empty()) {
    std::printf("SKIPPED: no GPU to test device memory on: %s\n", missing.c_str());
    return 77;
  }
  std::printf("device memory tests on %s memory\n",
              loom::test::host_mode() ? "host (TEST_GPU_MEMORY=host)" : "CUDA device 0");
  return Catch::Session().run(argc, argv);
}
