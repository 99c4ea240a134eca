// Memory regions with cxi's FI_MR_ENDPOINT life cycle: created disabled, bound to one enabled
// endpoint of the same domain, enabled, then usable only on that endpoint. The tcp;ofi_rxm
// registration (and with it the remote key) is made at fi_mr_enable, not at fi_mr_reg.
#include <new>

#include "objects.hpp"

namespace epmr {
namespace {

Mr& mr_of(const fid* f) noexcept {
  return *owner_of<Mr>(f);
}

int mr_close(fid* f) {
  return mr_of(f).close();
}
int mr_bind(fid* f, fid* bfid, uint64_t flags) {
  return mr_of(f).bind(bfid, flags);
}

int mr_control(fid* f, int command, void*) {
  if (command == FI_ENABLE) return mr_of(f).enable();
  return refuse("fi_control(mr): only FI_ENABLE is supported", -FI_ENOSYS);
}

fi_ops g_mr_fid_ops = {
    .size = sizeof(fi_ops),
    .close = mr_close,
    .bind = mr_bind,
    .control = mr_control,
    .ops_open = no_ops_open,
    .tostr = nullptr,
    .ops_set = nullptr,
};

}  // namespace

Mr::Mr(Domain& domain, const fi_mr_attr& attr, uint64_t flags)
    : handle_{},
      domain_(&domain),
      iov_(attr.mr_iov, attr.mr_iov + attr.iov_count),
      auth_key_(attr.auth_key, attr.auth_key + (attr.auth_key != nullptr ? attr.auth_key_size : 0)),
      attr_(attr),
      flags_(flags) {
  handle_.owner = this;
  handle_.fid.fid.fclass = FI_CLASS_MR;
  handle_.fid.fid.context = attr.context;
  handle_.fid.fid.ops = &g_mr_fid_ops;
  // The descriptor exists from the start, so that using it too early can be refused on the data
  // path; the key does not, as there is no registration to name until fi_mr_enable.
  handle_.fid.mem_desc = this;
  handle_.fid.key = FI_KEY_NOTAVAIL;
}

int Mr::reg(Domain& domain, const fi_mr_attr& attr, uint64_t flags, fid_mr** out) {
  if (attr.mr_iov == nullptr || attr.iov_count == 0) return refuse("fi_mr_reg: no memory given");
  if (attr.iov_count > domain.mr_iov_limit())
    return refuse("fi_mr_regv: more iovs than domain_attr->mr_iov_limit");
  std::unique_ptr<Mr> mr;
  try {
    mr.reset(new Mr(domain, attr, flags));
  } catch (const std::bad_alloc&) {
    return -FI_ENOMEM;
  }
  domain.mr_opened();
  *out = &mr.release()->handle_.fid;
  return 0;
}

int Mr::bind(fid* bfid, uint64_t) noexcept {
  if (bfid != nullptr && bfid->fclass == FI_CLASS_CNTR)
    return refuse("fi_mr_bind: binding counters to MRs is not supported", -FI_ENOSYS);
  Endpoint* ep = Endpoint::from_user(bfid);
  if (ep == nullptr) return refuse("fi_mr_bind: not an epmr endpoint");

  const std::lock_guard lock(mutex_);
  if (inner_) return refuse("fi_mr_bind: MR is already enabled");
  if (bound_ep_ != nullptr) return refuse("fi_mr_bind: MR is already bound to an endpoint");
  if (&ep->domain() != domain_) return refuse("fi_mr_bind: endpoint belongs to another domain");
  // cxi binds only to enabled endpoints; requiring it here catches the same ordering bug.
  if (!ep->enabled()) return refuse("fi_mr_bind: endpoint is not enabled yet");
  if (!ep->attach_mr()) return refuse("fi_mr_bind: endpoint is being closed");
  bound_ep_ = ep;
  return 0;
}

int Mr::enable() noexcept {
  const std::lock_guard lock(mutex_);
  if (bound_ep_ == nullptr) return refuse("fi_mr_enable: MR is not bound to an endpoint");
  if (inner_) return 0;

  fi_mr_attr attr = attr_;
  attr.mr_iov = iov_.data();
  attr.iov_count = iov_.size();
  attr.auth_key = auth_key_.empty() ? nullptr : auth_key_.data();
  attr.auth_key_size = auth_key_.size();
  attr.context = &handle_.fid.fid;
  const bool inner_chooses_key = (domain_->inner_view().mr_mode & FI_MR_PROV_KEY) != 0;
  attr.requested_key = inner_chooses_key ? 0 : domain_->next_key();

  fid_mr* inner = nullptr;
  if (const int rc = fi_mr_regattr(domain_->inner(), &attr, flags_, &inner); rc != 0) return rc;
  inner_.reset(inner);
  inner_desc_ = fi_mr_desc(inner);
  handle_.fid.key = fi_mr_key(inner);
  active_ep_.store(bound_ep_, std::memory_order_release);
  return 0;
}

int Mr::close() noexcept {
  {
    const std::lock_guard lock(mutex_);
    active_ep_.store(nullptr, std::memory_order_release);
    if (const int rc = close_inner(inner_); rc != 0) {
      active_ep_.store(bound_ep_, std::memory_order_release);
      return rc;
    }
    if (bound_ep_ != nullptr) bound_ep_->detach_mr();
  }
  domain_->mr_closed();
  delete this;
  return 0;
}

}  // namespace epmr
