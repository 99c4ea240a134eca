#include "ofi/fid.hpp"

#include <new>

#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>

#include "util/log.hpp"

namespace loom::ofi {
namespace {

template <typename T>
constexpr const char* kind() {
  if constexpr (std::is_same_v<T, fid_fabric>) return "fabric";
  if constexpr (std::is_same_v<T, fid_domain>) return "domain";
  if constexpr (std::is_same_v<T, fid_av>) return "address vector";
  if constexpr (std::is_same_v<T, fid_cq>) return "completion queue";
  if constexpr (std::is_same_v<T, fid_ep>) return "endpoint";
  if constexpr (std::is_same_v<T, fid_mr>) return "memory region";
}

}  // namespace

template <typename T>
void FidCloser<T>::operator()(T* object) const noexcept {
  int rc = fi_close(&object->fid);
  if (rc != 0) {
    util::log().error("fi_close({}) failed: {} ({})", kind<T>(), fi_strerror(-rc), rc);
  }
}

template struct FidCloser<fid_fabric>;
template struct FidCloser<fid_domain>;
template struct FidCloser<fid_av>;
template struct FidCloser<fid_cq>;
template struct FidCloser<fid_ep>;
template struct FidCloser<fid_mr>;

void InfoDeleter::operator()(fi_info* info) const noexcept {
  fi_freeinfo(info);
}

InfoPtr duplicate(const fi_info& info) {
  InfoPtr copy(fi_dupinfo(&info));
  if (!copy) throw std::bad_alloc();
  return copy;
}

}  // namespace loom::ofi
