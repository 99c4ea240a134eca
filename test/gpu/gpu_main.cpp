// The GPU tests' main: without a GPU (no CUDA in the build, no driver, no device) it prints why
// and exits 77, which meson counts as skipped. TEST_GPU_MEMORY=host runs them on host buffers.
#define CATCH_CONFIG_RUNNER
#include <cstdio>
#include <cstdlib>

#include <catch2/catch.hpp>

#include "gpu/gpu_support.hpp"

int main(int argc, char** argv) {
  if (std::getenv("LOOM_PROVIDER") == nullptr) {
    setenv("LOOM_PROVIDER", "tcp", 1);
    setenv("LOOM_NICS", "lo", 1);
    setenv("FI_PROVIDER", "tcp", 1);
  }
  const std::string missing = loom::test::gpu_missing();
  if (!missing.empty()) {
    std::printf("SKIPPED: no GPU to test device memory on: %s\n", missing.c_str());
    return 77;
  }
  std::printf("device memory tests on %s memory\n",
              loom::test::host_mode() ? "host (TEST_GPU_MEMORY=host)" : "CUDA device 0");
  return Catch::Session().run(argc, argv);
}
