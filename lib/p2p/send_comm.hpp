// The sending side: eager tagged sends into posted eager receives, RDMA writes otherwise.
#pragma once

#include <vector>

#include "p2p/comm.hpp"

namespace loom::p2p {

class SendCommImpl final : public Comm {
 public:
  SendCommImpl(std::shared_ptr<ContextCore> core, mux::Lane& lane);

  Status isend(const void* data, std::size_t size, Tag tag, const MemoryRegion& region,
               Request*& request);

  void on_op(Request& request, std::size_t index, const ofi::Completion& completion) override;
  void on_control(const mux::ControlHeader& header, std::span<const std::byte> body) override;
  void on_remote_write(mux::WriteImmediate immediate) override;

 private:
  // What the receiver told us about the buffer posted for one sequence number.
  struct Clearance {
    bool valid = false;
    std::uint32_t seq = 0;
    std::uint64_t size = 0;
    std::uint32_t tag = 0;
    bool eager_receive = true;
    bool refused = false;
    std::uint64_t address = 0;
  };

  void advance(Request& request) override;
  void cancel(Request&) override {}  // sends are not cancelled: they complete or fail
  [[nodiscard]] CloseNotice close_notice() override;
  void fail_unfinished(const CloseNotice& notice, const std::string& why) override;
  void settle_after_close() override;
  void flush_control() override;
  void match(Request& request);
  void post_stripes(Request& request);
  void update_done(Request& request);
  void send_writes_posted(const CloseNotice& notice);
  [[gnu::cold]] void fail_send(Request& request, const ofi::Completion& completion);
  [[nodiscard]] std::uint8_t stripe_count(std::size_t size) const noexcept;

  std::uint32_t next_seq_ = 0;
  std::size_t min_stripe_;
  std::vector<Clearance> clearances_;        // by seq % kSeqWindow
  std::size_t key_stride_;                   // the lane's data rails
  std::vector<std::uint64_t> keys_;          // kSeqWindow x key_stride_ remote keys
  std::vector<Request*> waiting_;            // sends by seq % kSeqWindow
  std::vector<std::uint8_t> writes_posted_;  // writes posted for each seq, by seq % kSeqWindow
  ReadyToSend batch_;                        // ready-to-sends not sent yet
  std::vector<Request*> batched_;            // the requests they belong to
};

}  // namespace loom::p2p
