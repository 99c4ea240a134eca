// epmr: a libfabric DL provider that layers over tcp;ofi_rxm and *requires* FI_MR_ENDPOINT, so
// code written for providers such as cxi (memory regions bound to and enabled on an endpoint)
// runs in CI. See README.md for what it enforces and how to select it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <rdma/fi_tagged.h>
#include <rdma/providers/fi_prov.h>

namespace epmr {

inline constexpr const char* kProviderName = "epmr";
inline constexpr const char* kInnerProvider = "tcp;ofi_rxm";
inline constexpr uint32_t kProviderVersion = FI_VERSION(1, 0);
// Built against these headers; libfabric skips a provider older than the API a caller asks for.
inline constexpr uint32_t kApiVersion = FI_VERSION(FI_MAJOR_VERSION, FI_MINOR_VERSION);

// What epmr demands of applications, as cxi does. No FI_MR_VIRT_ADDR: RMA addresses are offsets
// into the region, exactly as tcp;ofi_rxm has them, so nothing is translated on the data path.
inline constexpr uint64_t kRequiredMrMode =
    FI_MR_ENDPOINT | FI_MR_PROV_KEY | FI_MR_ALLOCATED | FI_MR_LOCAL;
// What epmr itself can cope with from the layer below: it always holds the inner descriptor and
// key, so inner providers that want local descriptors or choose keys are fine. FI_MR_VIRT_ADDR is
// withheld so the inner layer never starts wanting virtual addresses that epmr does not report.
inline constexpr uint64_t kInnerMrMode = FI_MR_LOCAL | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
// Capabilities whose operations epmr does not forward, so it never reports them.
inline constexpr uint64_t kUnsupportedCaps = FI_ATOMIC | FI_MULTICAST | FI_COLLECTIVE | FI_TRIGGER |
                                             FI_NAMED_RX_CTX | FI_RMA_EVENT | FI_XPU_TRIGGER |
                                             FI_PEER | FI_RMA_PMEM;
// fi_getinfo flags an application may pass. libfabric's utility providers add private bits when
// they look for a core provider to layer over; epmr refuses those requests so that ofi_rxm is
// never stacked on top of it.
inline constexpr uint64_t kPublicGetinfoFlags = FI_NUMERICHOST | FI_SOURCE | FI_PROV_ATTR_ONLY;

// Descriptor arrays are translated on the stack; larger iov counts are refused.
inline constexpr size_t kMaxIov = 8;
// fi_trywait translates its fid array on the stack too.
inline constexpr int kMaxTrywaitFids = 64;

fi_provider& provider();

// Test knobs, read once when the provider loads (FI_EPMR_<NAME>; README "Test knobs"). All off
// by default: epmr then only enforces FI_MR_ENDPOINT.
struct Knobs {
  // FI_EPMR_FAIL_RECV_AFTER: each endpoint's untagged receives (fi_recv) after its first n
  // fail with -FI_EIO: a receive queue that breaks for good once set up. 0 = never.
  size_t fail_recv_after = 0;
  // FI_EPMR_FAIL_RECV_EVERY: every n-th untagged receive that reposts a context the endpoint
  // has posted before fails with -FI_EAGAIN (back-pressure). 0 = never.
  size_t fail_recv_every = 0;
  // FI_EPMR_FAIL_TINJECT_EVERY: every n-th tagged inject (fi_tinject, fi_tinjectdata) of an
  // endpoint fails with -FI_EAGAIN (its peer's queue full, as shm says). 0 = never.
  size_t fail_tinject_every = 0;
  // FI_EPMR_RX_CQ_DATA: report FI_RX_CQ_DATA mode and emulate it (rx_cq_data.cpp).
  bool rx_cq_data = false;
  // FI_EPMR_MAX_MSG_SIZE: report this ep_attr->max_msg_size (when below tcp;ofi_rxm's) and
  // refuse longer sends, writes and reads with -FI_EINVAL. 0 = tcp;ofi_rxm's.
  size_t max_msg_size = 0;
};
const Knobs& knobs() noexcept;

// Fails a call that breaks an epmr rule: -FI_EINVAL, or the given code. With FI_EPMR_VERBOSE=1
// the reason goes to stderr, which is how a library engineer finds out which rule tripped.
[[gnu::cold]] int refuse(const char* reason, int code = -FI_EINVAL) noexcept;
// The data-path refusal: `op` was given a missing descriptor or one whose MR is not enabled and
// bound to the endpoint the operation was posted on.
[[gnu::cold]] int refuse_desc(const char* op) noexcept;

// Pairs the struct libfabric hands back to us with the object that owns it. Fid is first, so a
// `fid*` from libfabric converts back to the Handle (pointer-interconvertible first members).
template <typename Fid, typename Owner>
struct Handle {
  Fid fid;
  Owner* owner;
};

template <typename Owner, typename Fid>
Owner* owner_of(const Fid* fid) noexcept {
  using H = Handle<typename Owner::FidType, Owner>;
  return reinterpret_cast<const H*>(fid)->owner;
}

// Owns an inner (tcp;ofi_rxm) object while an epmr object is being set up. Normal teardown goes
// through close(), which must see fi_close fail and keep the object alive; it calls release().
template <typename T>
struct InnerCloser {
  void operator()(T* object) const noexcept { static_cast<void>(fi_close(&object->fid)); }
};
template <typename T>
using Inner = std::unique_ptr<T, InnerCloser<T>>;

template <typename T>
int close_inner(Inner<T>& inner) noexcept {
  if (inner) {
    const int rc = fi_close(&inner->fid);
    if (rc != 0) return rc;
    static_cast<void>(inner.release());
  }
  return 0;
}

struct InfoDeleter {
  void operator()(fi_info* info) const noexcept { fi_freeinfo(info); }
};
using InfoPtr = std::unique_ptr<fi_info, InfoDeleter>;

// Common stubs for entry points that epmr does not offer.
int no_ops_open(fid* object, const char* name, uint64_t flags, void** ops, void* context);
int no_bind(fid* object, fid* bfid, uint64_t flags);
int no_control(fid* object, int command, void* arg);

}  // namespace epmr
