// Fabric and domain objects: opened on top of tcp;ofi_rxm, they hand out epmr children.
#include <new>

#include "objects.hpp"

namespace epmr {
namespace {

// ---- fabric ----

int fabric_close(fid* f) {
  return owner_of<Fabric>(f)->close();
}

int fabric_domain2(fid_fabric* f, fi_info* info, fid_domain** out, uint64_t flags, void* context) {
  if (flags != 0) return refuse("fi_domain2 flags are not supported", -FI_ENOSYS);
  return Domain::open(*owner_of<Fabric>(f), info, out, context);
}

int fabric_domain(fid_fabric* f, fi_info* info, fid_domain** out, void* context) {
  return fabric_domain2(f, info, out, 0, context);
}

int fabric_passive_ep(fid_fabric*, fi_info*, fid_pep**, void*) {
  return -FI_ENOSYS;
}

int fabric_eq_open(fid_fabric* f, fi_eq_attr* attr, fid_eq** out, void* context) {
  return Eq::open(*owner_of<Fabric>(f), attr, out, context);
}

int fabric_wait_open(fid_fabric*, fi_wait_attr*, fid_wait**) {
  return -FI_ENOSYS;
}

int fabric_trywait(fid_fabric* f, fid** fids, int count) {
  if (count < 0 || count > kMaxTrywaitFids) return refuse("fi_trywait: too many fids");
  fid* inner[kMaxTrywaitFids];
  for (int i = 0; i < count; ++i) {
    inner[i] = inner_waitable(fids[i]);
    if (inner[i] == nullptr) return refuse("fi_trywait: not an epmr CQ, EQ or counter");
  }
  return fi_trywait(owner_of<Fabric>(f)->inner(), inner, count);
}

fi_ops g_fabric_fid_ops = {
    .size = sizeof(fi_ops),
    .close = fabric_close,
    .bind = no_bind,
    .control = no_control,
    .ops_open = no_ops_open,
    .tostr = nullptr,
    .ops_set = nullptr,
};

fi_ops_fabric g_fabric_ops = {
    .size = sizeof(fi_ops_fabric),
    .domain = fabric_domain,
    .passive_ep = fabric_passive_ep,
    .eq_open = fabric_eq_open,
    .wait_open = fabric_wait_open,
    .trywait = fabric_trywait,
    .domain2 = fabric_domain2,
};

// ---- domain ----

int domain_close(fid* f) {
  return owner_of<Domain>(f)->close();
}

int domain_av_open(fid_domain* d, fi_av_attr* attr, fid_av** out, void* context) {
  return Av::open(*owner_of<Domain>(d), attr, out, context);
}

int domain_cq_open(fid_domain* d, fi_cq_attr* attr, fid_cq** out, void* context) {
  return Cq::open(*owner_of<Domain>(d), attr, out, context);
}

int domain_endpoint2(fid_domain* d, fi_info* info, fid_ep** out, uint64_t flags, void* context) {
  return Endpoint::open(*owner_of<Domain>(d), info, out, context, flags);
}

int domain_endpoint(fid_domain* d, fi_info* info, fid_ep** out, void* context) {
  return domain_endpoint2(d, info, out, 0, context);
}

int domain_scalable_ep(fid_domain*, fi_info*, fid_ep**, void*) {
  return -FI_ENOSYS;
}

int domain_cntr_open(fid_domain* d, fi_cntr_attr* attr, fid_cntr** out, void* context) {
  return Cntr::open(*owner_of<Domain>(d), attr, out, context);
}

int domain_poll_open(fid_domain*, fi_poll_attr*, fid_poll**) {
  return -FI_ENOSYS;
}
int domain_stx_ctx(fid_domain*, fi_tx_attr*, fid_stx**, void*) {
  return -FI_ENOSYS;
}
int domain_srx_ctx(fid_domain*, fi_rx_attr*, fid_ep**, void*) {
  return -FI_ENOSYS;
}
int domain_query_atomic(fid_domain*, fi_datatype, fi_op, fi_atomic_attr*, uint64_t) {
  return -FI_EOPNOTSUPP;
}
int domain_query_collective(fid_domain*, fi_collective_op, fi_collective_attr*, uint64_t) {
  return -FI_EOPNOTSUPP;
}

int mr_regattr(fid* f, const fi_mr_attr* attr, uint64_t flags, fid_mr** out) {
  Domain* domain = Domain::from_user(f);
  if (domain == nullptr || attr == nullptr || out == nullptr)
    return refuse("fi_mr_reg: not an epmr domain");
  return Mr::reg(*domain, *attr, flags, out);
}

int mr_regv(fid* f, const iovec* iov, size_t count, uint64_t access, uint64_t offset,
            uint64_t requested_key, uint64_t flags, fid_mr** out, void* context) {
  fi_mr_attr attr = {};
  attr.mr_iov = iov;
  attr.iov_count = count;
  attr.access = access;
  attr.offset = offset;
  attr.requested_key = requested_key;
  attr.context = context;
  attr.iface = FI_HMEM_SYSTEM;
  return mr_regattr(f, &attr, flags, out);
}

int mr_reg(fid* f, const void* buf, size_t len, uint64_t access, uint64_t offset,
           uint64_t requested_key, uint64_t flags, fid_mr** out, void* context) {
  const iovec iov = {const_cast<void*>(buf), len};
  return mr_regv(f, &iov, 1, access, offset, requested_key, flags, out, context);
}

fi_ops g_domain_fid_ops = {
    .size = sizeof(fi_ops),
    .close = domain_close,
    .bind = no_bind,
    .control = no_control,
    .ops_open = no_ops_open,
    .tostr = nullptr,
    .ops_set = nullptr,
};

fi_ops_domain g_domain_ops = {
    .size = sizeof(fi_ops_domain),
    .av_open = domain_av_open,
    .cq_open = domain_cq_open,
    .endpoint = domain_endpoint,
    .scalable_ep = domain_scalable_ep,
    .cntr_open = domain_cntr_open,
    .poll_open = domain_poll_open,
    .stx_ctx = domain_stx_ctx,
    .srx_ctx = domain_srx_ctx,
    .query_atomic = domain_query_atomic,
    .query_collective = domain_query_collective,
    .endpoint2 = domain_endpoint2,
};

fi_ops_mr g_mr_ops = {
    .size = sizeof(fi_ops_mr),
    .reg = mr_reg,
    .regv = mr_regv,
    .regattr = mr_regattr,
};

}  // namespace

// ---- Fabric ----

Fabric::Fabric(void* context) noexcept : handle_{} {
  handle_.owner = this;
  handle_.fid.fid.fclass = FI_CLASS_FABRIC;
  handle_.fid.fid.context = context;
  handle_.fid.fid.ops = &g_fabric_fid_ops;
  handle_.fid.ops = &g_fabric_ops;
}

Fabric* Fabric::from_user(const fid* user) noexcept {
  if (user == nullptr || user->fclass != FI_CLASS_FABRIC || user->ops != &g_fabric_fid_ops)
    return nullptr;
  return owner_of<Fabric>(user);
}

int Fabric::open(fi_fabric_attr* attr, fid_fabric** out, void* context) {
  if (attr == nullptr || attr->name == nullptr || out == nullptr) return -FI_EINVAL;
  // The fabric attribute names epmr; tcp;ofi_rxm must be opened with its own.
  InfoPtr inner_info;
  if (const int rc = query_inner_fabric(*attr, inner_info); rc != 0) return rc;

  std::unique_ptr<Fabric> fabric(new (std::nothrow) Fabric(context));
  if (!fabric) return -FI_ENOMEM;
  fid_fabric* inner = nullptr;
  if (const int rc = fi_fabric(inner_info->fabric_attr, &inner, fabric->user()); rc != 0) return rc;
  fabric->inner_.reset(inner);
  *out = &fabric.release()->handle_.fid;
  return 0;
}

int Fabric::close() noexcept {
  if (const int rc = close_inner(inner_); rc != 0) return rc;
  delete this;
  return 0;
}

// ---- Domain ----

Domain::Domain(void* context) noexcept : handle_{} {
  handle_.owner = this;
  handle_.fid.fid.fclass = FI_CLASS_DOMAIN;
  handle_.fid.fid.context = context;
  handle_.fid.fid.ops = &g_domain_fid_ops;
  handle_.fid.ops = &g_domain_ops;
  handle_.fid.mr = &g_mr_ops;
}

Domain* Domain::from_user(const fid* user) noexcept {
  if (user == nullptr || user->fclass != FI_CLASS_DOMAIN || user->ops != &g_domain_fid_ops)
    return nullptr;
  return owner_of<Domain>(user);
}

int Domain::open(Fabric& fabric, fi_info* info, fid_domain** out, void* context) {
  if (info == nullptr || info->domain_attr == nullptr || out == nullptr) return -FI_EINVAL;
  std::unique_ptr<Domain> domain(new (std::nothrow) Domain(context));
  if (!domain) return -FI_ENOMEM;
  if (const int rc = query_inner(*info, domain->view_); rc != 0) return rc;
  const InfoPtr inner_info = to_inner_info(*info, domain->view_);
  if (!inner_info) return -FI_ENOMEM;
  if (info->domain_attr->mr_iov_limit != 0) domain->mr_iov_limit_ = info->domain_attr->mr_iov_limit;

  fid_domain* inner = nullptr;
  if (const int rc = fi_domain(fabric.inner(), inner_info.get(), &inner, domain->user()); rc != 0)
    return rc;
  domain->inner_.reset(inner);
  *out = &domain.release()->handle_.fid;
  return 0;
}

int Domain::close() noexcept {
  if (open_mrs_.load(std::memory_order_relaxed) != 0)
    return refuse("fi_close(domain): memory regions are still open", -FI_EBUSY);
  if (const int rc = close_inner(inner_); rc != 0) return rc;
  delete this;
  return 0;
}

}  // namespace epmr
