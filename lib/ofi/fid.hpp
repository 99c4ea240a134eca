// Typed owners for libfabric objects. The closers are defined in fid.cpp so that headers of
// this layer (included by lib/mux) need no rdma/* header: the fid types stay incomplete here.
#pragma once

#include <memory>

struct fi_info;
struct fid_fabric;
struct fid_domain;
struct fid_av;
struct fid_cq;
struct fid_ep;
struct fid_mr;

namespace loom::ofi {

// Closes a fid; a failure (e.g. -FI_EBUSY for an endpoint with MRs still bound) is logged with
// the object's kind and fi_strerror text, never thrown: closers run in destructors.
template <typename T>
struct FidCloser {
  void operator()(T* fid) const noexcept;
};

template <typename T>
using FidPtr = std::unique_ptr<T, FidCloser<T>>;

struct InfoDeleter {
  void operator()(fi_info* info) const noexcept;
};
using InfoPtr = std::unique_ptr<fi_info, InfoDeleter>;

// fi_dupinfo, throwing on allocation failure.
InfoPtr duplicate(const fi_info& info);

}  // namespace loom::ofi
