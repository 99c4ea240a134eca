// Completion routing. Every posted operation carries an OpContext; its handler is called when
// the operation's completion (or error) is read from the rail's CQ. Remote writes that carry CQ
// data have no local context: they go to the rail's RemoteWriteHandler instead.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "loom/error.hpp"

namespace loom::ofi {

class CompletionHandler;

// Size of libfabric's struct fi_context2, checked against the real type in rail.cpp.
inline constexpr std::size_t kProviderContextBytes = 64;

struct OpContext {
  // First, because providers in FI_CONTEXT/FI_CONTEXT2 mode use the memory the context pointer
  // points at as their own scratch space while the operation is outstanding.
  alignas(8) std::byte provider_scratch[kProviderContextBytes];
  CompletionHandler* handler = nullptr;
};

struct Completion {
  // kOk, kCancelled, kTruncated, kPeerError (the connection to the peer is gone) or kError.
  Status status = Status::kOk;
  bool has_data = false;  // `data` carries the sender's remote CQ data
  std::uint64_t tag = 0;
  std::uint64_t data = 0;
  std::size_t length = 0;       // bytes received (receives only)
  std::size_t overflow = 0;     // bytes that did not fit (kTruncated receives)
  std::string_view error_text;  // valid during the handler call only
};

class CompletionHandler {
 public:
  virtual void on_completion(OpContext& context, const Completion& completion) = 0;

 protected:
  ~CompletionHandler() = default;
};

class RemoteWriteHandler {
 public:
  // `data` is the writer's 32-bit (EFA) or wider remote CQ data.
  virtual void on_remote_write(std::uint64_t data) = 0;

 protected:
  ~RemoteWriteHandler() = default;
};

}  // namespace loom::ofi
