// Every message loom's p2p layer puts on the wire: the listen handle, the connection handshake
// (on the context's bootstrap endpoint) and the per-communicator control messages (on a lane's
// control rails). Decoders check lengths and ranges (and the handle its magic and version;
// control messages' magic and version are in the mux header; a connect's echoed magic,
// version and nonce are judged by the listener, which answers with a reason) before anything
// is used, and return the reason for a refusal (nullptr on success). Encoders return 0 for a
// value their decoder would refuse.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "mux/control_channel.hpp"
#include "mux/routing.hpp"

namespace loom::p2p {

enum class MessageType : std::uint8_t {
  // bootstrap endpoint
  kConnect = 1,
  kAccept = 2,
  kReject = 3,
  // lane control rails
  kClearToSend = 16,   // receiver -> sender: buffers posted for these sequence numbers; credits
  kReadyToSend = 17,   // sender -> receiver: size and tag where the writes cannot tell them
  kClose = 18,         // either way: the peer closed this communicator (a CloseNotice)
  kPing = 19,          // either way, while requests wait on the peer: are you there? (a Ping)
  kPong = 20,          // the answer (sent by the lane's progress, whatever the peer is doing)
  kWritesPosted = 21,  // sender -> receiver, answering its close notice (a WritesPosted)
  // One-sided connections (p2p/rma_comm.hpp)
  kNotify = 22,  // initiator -> target: a write batch landed (a Notify)
  // The target's region notes (a RegionNote each), always on control rail 0 so that they keep
  // their order: an answer that a region is live never overtakes its revocation.
  kRevoke = 23,        // target -> initiator: the region is being deregistered
  kRevoked = 24,       // initiator -> target: nothing of ours writes into it any more
  kRegionQuery = 25,   // initiator -> target, importing a descriptor: is the region live?
  kRegionAnswer = 26,  // target -> initiator
  // initiator -> target: a counted notification (NotifyProtocol::kCountedCqData) already sent
  // will never be complete (a write of its batch failed): skip it (a Notify, seq only)
  kNotifyCancel = 27,
  // sender -> receiver: announce the buffers for these messages (an AskClearance); a receiver
  // leaves a buffer only an eager message can fill unannounced until asked (clear_to_send.cpp)
  kAskClearance = 28,
};

inline constexpr std::uint32_t kHandleMagic = 0x4D4F4F4C;  // "LOOM"
// The handle and the connect carry the one wire protocol version, the control header's.
using mux::kProtocolVersion;
inline constexpr std::size_t kMaxAddressBytes = 96;
inline constexpr std::size_t kMaxHandleAddresses = 4;
inline constexpr std::size_t kMaxDataRails = 16;
inline constexpr std::size_t kMaxControlRails = 4;
inline constexpr std::size_t kMaxParts = 8;  // buffers per receive request

// An endpoint's name (fi_getname) as it crosses the wire; inserted into an address vector it
// becomes an ofi::Address.
using EndpointName = std::vector<std::byte>;

// ---- listen handle (at most 128 bytes) ----
inline constexpr std::size_t kHandleHeaderBytes = 4 + 1 + 1 + 4 + 8 + 8;
struct HandleData {
  std::uint32_t listener = 0;
  std::uint64_t nonce = 0;
  std::uint64_t context = 0;
  std::vector<EndpointName> addresses;  // the listener's bootstrap address(es), one per subnet
};
// Bytes written, or 0 if it does not fit in `out`.
std::size_t encode_handle(const HandleData& handle, std::span<std::byte> out);
const char* decode_handle(std::span<const std::byte> in, HandleData& out);

// ---- handshake ----
struct LaneAddresses {
  std::uint64_t lane = 0;  // the lane's id in its context
  std::uint16_t comm = 0;  // the communicator's id on that lane
  std::vector<EndpointName> data;
  std::vector<EndpointName> control;
};

// What a connect asks the listener for: a two-sided pair (SendComm here, RecvComm there) or a
// one-sided one (RmaInitiator here, RmaTarget there). Listener::accept and accept_rma each take
// their own kind.
enum class ConnectionKind : std::uint8_t { kTwoSided = 0, kOneSided = 1 };
const char* to_string(ConnectionKind kind);

struct ConnectMessage {
  std::uint32_t magic = kHandleMagic;  // echoed from the handle
  std::uint8_t version = kProtocolVersion;
  std::uint32_t listener = 0;
  std::uint64_t nonce = 0;
  std::uint64_t context = 0;  // the connector's context id
  std::uint32_t connect_id = 0;
  ConnectionKind kind = ConnectionKind::kTwoSided;
  std::uint64_t label = 0;  // the connector's (Context::connect), for the accepting side
  EndpointName reply_to;    // the connector's bootstrap address
  LaneAddresses lane;
};
std::size_t encode_connect(const ConnectMessage& message, std::span<std::byte> out);
const char* decode_connect(std::span<const std::byte> in, ConnectMessage& out);

struct AcceptMessage {
  std::uint32_t connect_id = 0;
  std::uint64_t context = 0;  // the acceptor's context id
  LaneAddresses lane;
};
std::size_t encode_accept(const AcceptMessage& message, std::span<std::byte> out);
const char* decode_accept(std::span<const std::byte> in, AcceptMessage& out);

enum class RejectReason : std::uint8_t {
  kBadMagic = 1,
  kBadVersion = 2,
  kUnknownListener = 3,
  kBadNonce = 4,
  kSetupFailed = 5,
};
struct RejectMessage {
  std::uint32_t connect_id = 0;
  RejectReason reason = RejectReason::kSetupFailed;
};
std::size_t encode_reject(const RejectMessage& message, std::span<std::byte> out);
const char* decode_reject(std::span<const std::byte> in, RejectMessage& out);
const char* to_string(RejectReason reason);

// ---- communicator control ----
// Entries are batched: a communicator collects what it has to announce and sends it in one
// message at the next progress of its lane (or when a batch fills).
inline constexpr std::size_t kMaxBatch = 64;  // a fabtests-sized window in one message

// What the receiver says of one posted buffer in a clear-to-send. The one struct for that fact
// on both ends: the receiver keeps what it announced, the wire carries it, and the sender judges
// its message against it (verdict.hpp) before writing, or, for a message it sent ahead on a
// credit, to learn the outcome the receiver reached.
struct Announcement {
  std::uint32_t seq = 0;
  std::uint64_t size = 0;  // the posted buffer's size
  std::uint32_t tag = 0;
  // The receive failed on the receiver before anything arrived: nothing may be sent into the
  // buffer, which is back with the receiver's application.
  bool refused = false;
  // The buffer is buffer group_index of an irecv of group_size (p2p/group.hpp).
  std::uint8_t group_index = 0;
  std::uint8_t group_size = 1;
};

// Every receive buffer is announced once, whatever its size, with where a rendezvous write
// goes. The batch also grants credits: eager buffers the receiver (re)posted since its last
// batch, each taking one message of up to `eager_size`.
struct CtsEntry {
  Announcement announcement;
  std::uint64_t address = 0;  // for rendezvous writes, per MemoryRegistration::remote_address
};
struct ClearToSend {
  std::uint8_t count = 0;
  std::uint8_t data_rails = 0;   // keys per entry
  std::uint16_t credits = 0;     // eager buffers granted with this batch
  std::uint32_t eager_size = 0;  // the size of each (0 with no credits)
  std::array<CtsEntry, kMaxBatch> entries;
  // Each entry's remote keys, data_rails of them from entries' index x data_rails: sized to the
  // communicator's rails, not kMaxDataRails (a batch per receiving communicator, per peer).
  std::vector<std::uint64_t> keys;
  [[nodiscard]] std::uint64_t* keys_of(std::size_t entry) noexcept {
    return keys.data() + entry * data_rails;
  }
};
inline constexpr std::size_t kCtsHeaderBytes = 1 + 1 + 2 + 4;
inline constexpr std::size_t kCtsEntryFixedBytes = 4 + 8 + 4 + 1 + 8;
inline constexpr std::size_t cts_bytes(std::size_t count, std::size_t rails) {
  return kCtsHeaderBytes + count * (kCtsEntryFixedBytes + 8 * rails);
}
// Entries one clear-to-send can carry with `rails` keys each.
inline constexpr std::size_t max_cts_entries(std::size_t rails) {
  const std::size_t fit =
      (mux::kMaxControlBody - kCtsHeaderBytes) / (kCtsEntryFixedBytes + 8 * rails);
  return fit < kMaxBatch ? fit : kMaxBatch;
}
// Credits one batch can grant, and the largest eager buffer.
inline constexpr std::size_t kMaxCreditsPerBatch = 0xFFFF;
inline constexpr std::size_t kMaxEagerBuffer = std::size_t{1} << 24;
std::size_t encode_cts(const ClearToSend& message, std::span<std::byte> out);
const char* decode_cts(std::span<const std::byte> in, ClearToSend& out);

// The data path reads a clear-to-send entry by entry, straight from the received bytes,
// instead of filling a ClearToSend.
struct CtsEntryView {
  Announcement announcement;
  std::uint64_t address = 0;
  const std::byte* keys = nullptr;  // data_rails() little-endian u64 values
};
class CtsReader {
 public:
  // Checks the counts and the total length; error() says what was wrong.
  explicit CtsReader(std::span<const std::byte> body) noexcept;
  [[nodiscard]] const char* error() const noexcept { return error_; }
  [[nodiscard]] std::size_t count() const noexcept { return count_; }
  [[nodiscard]] std::size_t data_rails() const noexcept { return rails_; }
  [[nodiscard]] std::size_t credits() const noexcept { return credits_; }
  [[nodiscard]] std::size_t eager_size() const noexcept { return eager_size_; }
  // Entry i (i < count(); only valid when error() is null).
  [[nodiscard]] CtsEntryView entry(std::size_t i) const noexcept;

 private:
  std::span<const std::byte> body_;
  std::size_t count_ = 0;
  std::size_t rails_ = 0;
  std::size_t credits_ = 0;
  std::size_t eager_size_ = 0;
  const char* error_ = nullptr;
};

struct RtsEntry {
  std::uint32_t seq = 0;
  std::uint64_t size = 0;
  std::uint32_t tag = 0;
  std::uint8_t stripes = 0;  // writes that carry the payload; none for an empty message
};
struct ReadyToSend {
  std::uint8_t count = 0;
  std::array<RtsEntry, kMaxBatch> entries;
};
inline constexpr std::size_t kRtsEntryBytes = 4 + 8 + 4 + 1;
inline constexpr std::size_t rts_bytes(std::size_t count) {
  return 1 + count * kRtsEntryBytes;
}
std::size_t encode_rts(const ReadyToSend& message, std::span<std::byte> out);
const char* decode_rts(std::span<const std::byte> in, ReadyToSend& out);

// Sequence numbers wrap: `a` comes before `b` when fewer than 2^31 steps lie from a to b.
constexpr bool seq_before(std::uint32_t a, std::uint32_t b) {
  return static_cast<std::int32_t>(a - b) < 0;
}
static_assert(seq_before(0xFFFFFFFFu, 0) && !seq_before(0, 0xFFFFFFFFu) && !seq_before(5, 5));

// A communicator's last word to its peer: which messages it finished. A sender has finished a
// message it handed to the provider whole (its data and any ready-to-send are on the way); a
// receiver, a buffer that was filled or failed with a verdict both sides share. Every message
// below `complete_below` is finished; of the next `span` ones, those whose bit is set (they
// can finish out of order). The peer keeps what that covers and fails the rest.
inline constexpr std::size_t kCloseWindow = 1024;
// Why a communicator ended on the side that sends the notice.
enum class CloseReason : std::uint8_t {
  kClosed = 0,  // its application closed it
  kFailed = 1,  // a provider error failed one of its requests (Comm::break_off)
  kLost = 2,    // it took the peer for dead (silent for LOOM_PEER_TIMEOUT_MS) and gave up
};
struct CloseNotice {
  std::uint32_t complete_below = 0;
  std::uint16_t span = 0;  // at most kCloseWindow
  // A receiver whose close waits for a WritesPosted answer (it had announced buffers it did
  // not finish); nobody answers a notice without it, whose sender may be gone at once.
  bool awaits_writes = false;
  CloseReason reason = CloseReason::kClosed;
  // A sender's: every RDMA write it posted on the communicator (a receiver's notice: 0). A
  // receiver keeps its endpoints until that many arrived.
  std::uint32_t writes_posted = 0;
  std::array<std::uint8_t, kCloseWindow / 8> finished_bits{};  // bit i: complete_below + i

  [[nodiscard]] bool finished(std::uint32_t seq) const noexcept {
    if (seq_before(seq, complete_below)) return true;
    const std::uint32_t offset = seq - complete_below;
    return offset < span && (finished_bits[offset / 8] >> (offset % 8) & 1u) != 0;
  }
  void set_finished(std::uint32_t offset) noexcept {
    finished_bits[offset / 8] |= static_cast<std::uint8_t>(1u << (offset % 8));
  }
};
inline constexpr std::size_t close_notice_bytes(std::size_t span) {
  return 4 + 2 + 1 + 4 + (span + 7) / 8;
}
// A sender's answer to its receiver's close notice: every RDMA write it posted on the
// communicator. The closing receiver keeps its endpoints (and the buffers) until that many
// arrived: a write still streaming in must not meet a closed endpoint or a buffer given back.
struct WritesPosted {
  std::uint32_t writes = 0;
};
inline constexpr std::size_t kWritesPostedBytes = 4;
std::size_t encode_writes_posted(const WritesPosted& message, std::span<std::byte> out);
const char* decode_writes_posted(std::span<const std::byte> in, WritesPosted& out);

// A sender's messages [from, until) wait for their buffers' clear-to-send: the receiver announces
// those it left unannounced (posted, or as they are posted). until - from <= kAskSpan.
struct AskClearance {
  std::uint32_t from = 0;
  std::uint32_t until = 0;
};
inline constexpr std::size_t kAskClearanceBytes = 8;
inline constexpr std::uint32_t kAskSpan = 1u << 16;
// Keeps an end of what was asked for within kAskSpan behind `seq`, called with each new number,
// so that comparing numbers with it holds however many messages went by.
constexpr void trail_ask(std::uint32_t& asked_until, std::uint32_t seq) noexcept {
  if (seq_before(asked_until, seq - kAskSpan)) asked_until = seq - kAskSpan;
}
std::size_t encode_ask_clearance(const AskClearance& message, std::span<std::byte> out);
const char* decode_ask_clearance(std::span<const std::byte> in, AskClearance& out);

// A ping. A sender with messages waiting for their clearance also names the oldest: the
// receiver announces again what it announced from there on (a clear-to-send carried on a
// message into a receiving communicator that closed before it landed is lost; see
// RecvCommImpl::repeat_clearances). The answer, a pong, has no body.
struct Ping {
  bool awaiting = false;
  std::uint32_t oldest_awaiting = 0;
};
inline constexpr std::size_t kPingAwaitingBytes = 4;
// 0 bytes (nothing awaiting) or kPingAwaitingBytes.
std::size_t encode_ping(const Ping& message, std::span<std::byte> out);
const char* decode_ping(std::span<const std::byte> in, Ping& out);

// An initiator's word that a write batch landed in the target's memory (every write of it
// completed delivery-complete before this was sent): numbered per connection from 0, so that the
// target hands them out in post order whichever control rail each came by. With
// NotifyProtocol::kCountedCqData it goes once the writes are posted instead, and the target
// holds it until `writes` writes whose remote CQ data names `counter` arrived.
struct Notify {
  std::uint32_t seq = 0;
  std::uint64_t tag = 0;
  std::uint64_t value = 0;
  std::uint32_t blocks = 0;
  std::uint64_t bytes = 0;
  std::uint32_t writes = 0;   // 0: landed already
  std::uint32_t counter = 0;  // below 2^mux::kImmSeqBits
};
inline constexpr std::size_t kNotifyBytes = 4 + 8 + 8 + 4 + 8 + 4 + 4;
std::size_t encode_notify(const Notify& message, std::span<std::byte> out);
const char* decode_notify(std::span<const std::byte> in, Notify& out);

// What the target and initiator tell each other about one of the target's regions: `seq` pairs
// an answer with its question (kRevoke/kRevoked, kRegionQuery/kRegionAnswer); `live` is the
// answer's.
struct RegionNote {
  std::uint32_t seq = 0;
  std::uint32_t slot = 0;
  std::uint32_t generation = 0;
  bool live = false;
};
inline constexpr std::size_t kRegionNoteBytes = 4 + 4 + 4 + 1;
std::size_t encode_region_note(const RegionNote& message, std::span<std::byte> out);
const char* decode_region_note(std::span<const std::byte> in, RegionNote& out);

// 0 for a span above kCloseWindow or bits set beyond it.
std::size_t encode_close(const CloseNotice& message, std::span<std::byte> out);
const char* decode_close(std::span<const std::byte> in, CloseNotice& out);

}  // namespace loom::p2p
