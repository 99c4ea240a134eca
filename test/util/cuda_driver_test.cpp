// The CUDA driver table without a GPU: loading the toolkit's stub library (every call answers
// CUDA_ERROR_STUB_LIBRARY), a library that is missing, and what a build without CUDA says.
#include "util/cuda_driver.hpp"

#include <cstdlib>
#include <string>

#include <catch2/catch.hpp>

#include "loom/device_memory.hpp"
#include "loom/error.hpp"
#include "loom_build_config.h"

namespace loom {

TEST_CASE("cuda driver: a library that cannot be loaded is an error naming it", "[cuda]") {
  CHECK_THROWS_WITH(util::cuda::Driver("libcuda-that-is-not-there.so.1"),
                    Catch::Contains(LOOM_HAVE_CUDA ? "dlopen(libcuda-that-is-not-there.so.1)"
                                                   : "built without CUDA"));
}

TEST_CASE("cuda driver: the toolkit's stub loads, and cuInit says it is a stub", "[cuda]") {
  const char* stub = std::getenv("TEST_CUDA_STUB");
  if (!LOOM_HAVE_CUDA || stub == nullptr) {
    SUCCEED("a build without CUDA, or no stub library named (TEST_CUDA_STUB)");
    return;
  }
  util::cuda::Driver driver(stub);
  CHECK(driver.library() == stub);
  // Every symbol loom binds is exported; only running them shows it is no driver.
  CHECK_THROWS_WITH(driver.initialize(), Catch::Contains("cuInit failed") &&
                                             Catch::Contains("34") && Catch::Contains(stub));
  CHECK(driver.pointer_info(&driver).kind == util::cuda::PointerKind::kUnknown);
  CHECK_FALSE(driver.dmabuf_supported(0));
}

TEST_CASE("cuda driver: device memory without a usable driver says why", "[cuda]") {
  // On a machine with a GPU (and a CUDA build) this is a real allocation instead.
  std::string reason;
  try {
    CudaBuffer buffer(0, 4096);
    buffer.fill(std::byte{1});
    std::byte back[8] = {};
    buffer.copy_to_host(100, back, sizeof back);
    CHECK(back[0] == std::byte{1});
    CHECK_THROWS_WITH(buffer.copy_to_host(4090, back, sizeof back),
                      Catch::Contains("outside the 4096-byte CUDA buffer"));
    return;
  } catch (const Error& e) {
    reason = e.what();
  }
  INFO(reason);
  if (!LOOM_HAVE_CUDA) {
    CHECK_THAT(reason, Catch::Contains("built without CUDA (meson setup -Dcuda=enabled)"));
  } else if (reason.find("no CUDA device 0") != std::string::npos) {
    CHECK(cuda_devices().empty());  // a driver without a GPU
    return;
  } else {
    CHECK_THAT(reason, Catch::Contains("dlopen(libcuda.so.1) failed"));
  }
  CHECK_THROWS_WITH(cuda_devices(), Catch::Contains(reason.substr(reason.find(": ") + 2)));
  CHECK(util::cuda::Driver::if_loaded() == nullptr);
}

}  // namespace loom
