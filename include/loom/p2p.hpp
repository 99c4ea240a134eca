// loom's point-to-point API: listen/connect/accept with an opaque handle, registered memory,
// non-blocking tagged send/receive, flush and close. Setup calls throw loom::Error; data-path
// calls return a Status and never throw.
//
// Matching: the n-th message sent on a communicator lands in the n-th receive buffer posted on
// its peer (an irecv of k buffers takes k messages, in order); the message's tag must equal that
// buffer's tag. A buffer may be larger than its message (the delivered size is reported); a
// message larger than its buffer, or with another tag, fails on both sides and moves no data.
//
// Threads: different communicators may be used from different threads at once; one
// communicator is used by one thread at a time. A Context may be shared by threads.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "loom/config.hpp"
#include "loom/error.hpp"
#include "loom/memory.hpp"

namespace loom {

namespace p2p {
class Comm;
class ContextCore;
class ConnectorState;
class ListenerState;
}  // namespace p2p

using Tag = std::uint32_t;

class RmaConnector;  // loom/rma.hpp
class RmaTarget;

// Names one operation posted on one communicator (isend, irecv, iflush). A value: copy it
// freely. It names its operation until test() or wait() reported the operation done, or the
// communicator closed; after that it names nothing, whatever the communicator runs meanwhile,
// and test() or wait() with it return kInvalid (so does a handle of another communicator).
// Except a send done within isend (a small message the provider took whole, by an inject, on a
// credit): its handle holds no operation (nothing to look up, no room among kMaxRequestsPerComm
// taken), and test() or wait() report it done, with its size, however often asked.
class Request {
 public:
  Request() = default;  // names nothing
  // Whether it was ever given by a post (a default-constructed handle was not).
  [[nodiscard]] bool valid() const noexcept { return generation_ != 0; }
  bool operator==(const Request&) const = default;

 private:
  friend class p2p::Comm;
  Request(std::uint64_t comm, std::uint32_t index, std::uint32_t generation) noexcept
      : comm_(comm), index_(index), generation_(generation) {}
  std::uint64_t comm_ = 0;  // the communicator's serial number in its process
  std::uint32_t index_ = 0;
  std::uint32_t generation_ = 0;
};

// What posting an operation gives: kOk and the request, or why nothing was posted (and an
// empty request).
struct [[nodiscard]] Posted {
  Status status = Status::kOk;
  Request request;
};

inline constexpr std::size_t kMaxRecvBuffers = 8;
// Requests one communicator keeps in flight; one more is refused with kRetry.
inline constexpr std::size_t kMaxRequestsPerComm = 128;
inline constexpr std::size_t kMaxHandleBytes = 128;

// What listen() gives and connect() takes: at most 128 bytes, to be passed to the peer by any
// out-of-band means (MPI, a file, a TCP socket).
struct Handle {
  std::array<std::byte, kMaxHandleBytes> bytes{};
  std::size_t size = 0;

  [[nodiscard]] std::span<const std::byte> view() const noexcept { return {bytes.data(), size}; }
  // Throws loom::Error if `data` is longer than kMaxHandleBytes. Contents are checked by connect.
  static Handle from_bytes(std::span<const std::byte> data);
};

// A registration made on a communicator (usable on that one only) or on a context (usable on
// every communicator of it: Context::register_memory). Cheap to copy; names nothing once
// deregistered (a post with it returns kInvalid).
class MemoryRegion {
 public:
  MemoryRegion() = default;
  // Whether register_memory gave it (a default-constructed region was not).
  [[nodiscard]] bool valid() const noexcept { return generation_ != 0; }

 private:
  friend class p2p::Comm;
  friend class p2p::ContextCore;
  std::uint64_t owner_ = 0;  // the communicator's serial number in its process, or the context's id
  std::uint32_t slot_ = 0;
  std::uint32_t generation_ = 0;
};

struct RecvBuffer {
  void* data = nullptr;
  std::size_t size = 0;
  Tag tag = 0;
  MemoryRegion region;
};

struct CommStats {
  std::uint64_t messages = 0;  // sends reported done (or done at their post), buffers received
  std::uint64_t bytes = 0;
  std::uint64_t eager = 0;  // messages that went eagerly
  // Of those, the ones that went ahead in several eager fragments (LOOM_EAGER_FRAGMENTS): sent,
  // or received whole.
  std::uint64_t eager_fragmented = 0;
  std::uint64_t rendezvous = 0;  // messages that went by RDMA write
  // A receiving communicator's clear-to-send batches: sent as control messages of their own,
  // or carried inside a message our side sent to the same peer context the other way.
  std::uint64_t cts_sent = 0;
  std::uint64_t cts_carried = 0;
  // A sending communicator's asks for clear-to-sends: a receiver announces a buffer that only an
  // eager message can fill when its sender has no credit for it (or a larger message) and asks.
  std::uint64_t asks_sent = 0;
  // Control messages (clear-to-sends, ready-to-sends, asks) the provider pushed back: the peer
  // takes none (stopped, or far behind). Retried with a growing wait between tries.
  std::uint64_t control_pushed_back = 0;
  std::size_t lane_comms = 0;  // communicators sharing this one's lane
  std::uint64_t lane_id = 0;
  std::vector<std::string> data_nics;  // the NIC of each data rail, in rail order
};

class Communicator {
 public:
  virtual ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  // Registers host (or, with a CUDA build, device) memory for this communicator's endpoints.
  // Registrations of the same pages in use at once (on this or another communicator of the
  // lane) share one provider registration; the last deregister releases it at once, so
  // registering again later registers anew. Throws loom::Error.
  // The memory must stay allocated until it is deregistered: on RDMA NICs (verbs, EFA, CXI) a
  // registration pins the physical pages it was made on, so a region whose memory is freed (or
  // unmapped and mapped again) while registered keeps naming the old pages, and transfers
  // through it read or write those instead of what is now at the address.
  MemoryRegion register_memory(const void* data, std::size_t size,
                               MemoryType type = MemoryType::kHost, int device = 0);
  // The same for CUDA memory handed over as a dmabuf too (what NCCL gives a net plugin):
  // `data` is the range's address in this process, `dmabuf` the descriptor exporting it and
  // where `data` lies in it. Registered through the dmabuf on NICs that take one
  // (NicDescription::dmabuf), by address on the others. The descriptor is read during the call
  // only. Throws loom::Error, also for a negative descriptor or host memory. (Context::
  // register_memory has no dmabuf form.)
  MemoryRegion register_memory(const void* data, std::size_t size, MemoryType type, int device,
                               const Dmabuf& dmabuf);
  // Releases the region (and the provider registration with its last user). The handle is
  // invalid at once; a region that pending requests still use is released when the last of
  // them ended (the provider may still read or write through it until then), so its memory
  // must stay allocated until those requests are done. Deregister before freeing the memory.
  void deregister(MemoryRegion region);

  // Makes progress. kInProgress while the request runs. Once it finished, its outcome (kOk,
  // or an error that last_error() explains), and the handle names nothing from then on.
  // `sizes` receives the delivered size of each buffer of a receive (or the size sent).
  // kInvalid (last_error() says which) for a handle that names no pending request of this
  // communicator: empty, already reported done (but a send done at its post: see Request), or
  // another communicator's.
  [[nodiscard]] Status test(Request request, std::span<std::size_t> sizes = {});
  // test() until done. A peer that stays silent for LOOM_PEER_TIMEOUT_MS (dead, unreachable, or
  // stopped) fails the request (kPeerError). A live process answers whatever its application
  // does: its context progresses the lanes nobody else does in the background (a thread that
  // sleeps between turns). A live peer that never posts the matching request does not fail
  // it: wait returns kInProgress once `timeout` passed, the request still pending (test or wait
  // on it again). While nothing completes it yields the CPU, then sleeps in steps of up to a
  // millisecond.
  [[nodiscard]] Status wait(Request request, std::span<std::size_t> sizes = {},
                            std::chrono::milliseconds timeout = std::chrono::milliseconds::max());

  // Cancels pending requests (their handles name nothing from then on), tells the peer how far
  // this side got, and releases the communicator's share of its lane. Safe with requests in
  // flight; idempotent; the destructor calls it. It blocks while the peer's writes into this
  // side's buffers may still arrive: up to LOOM_PEER_TIMEOUT_MS (10 s by default) when the peer
  // is stopped or unreachable, and about a round trip when it is alive. What the peer's pending
  // requests become (see the README's Failures section): a message this side had received, or had
  // handed to the provider whole, still completes over there with its own outcome; the others fail
  // with kPeerError. Returns once the provider handed back this side's operations and the writes
  // the peer had posted into this side's buffers arrived, unless the peer is lost (silent for
  // LOOM_PEER_TIMEOUT_MS): then this side's buffers are its own again. The close notice leaves in
  // the background where the provider cannot take it yet (the lane stays open for it, up to
  // LOOM_PEER_TIMEOUT_MS).
  void close();

  [[nodiscard]] const std::string& last_error() const noexcept;
  [[nodiscard]] CommStats stats() const;
  // The label the connecting side passed to Context::connect (0 if it passed none), the same
  // on both communicators of the pair: accept() hands out connections in the order they came,
  // and this tells the accepting side which peer (which rank, say) each one is. 0 once closed.
  [[nodiscard]] std::uint64_t label() const noexcept;

 protected:
  Communicator(std::shared_ptr<p2p::ContextCore> context, std::unique_ptr<p2p::Comm> comm);
  // The context (lane registry, NICs) outlives the communicator: close() lets go of it last.
  std::shared_ptr<p2p::ContextCore> context_;
  std::unique_ptr<p2p::Comm> comm_;
};

// Only the library makes communicators (Listener::accept, Connector::poll): this key opens
// their constructors to it alone, while std::make_unique can still call them.
class CommKey {
  friend class p2p::ListenerState;
  friend class p2p::ConnectorState;
  CommKey() = default;
};

class SendComm final : public Communicator {
 public:
  SendComm(CommKey, std::shared_ptr<p2p::ContextCore> context, std::unique_ptr<p2p::Comm> comm);
  // kOk and the request. kRetry: too many requests in flight, test some and try again.
  // kInvalid: bad region/buffer, a message larger than the NICs take
  // (NicDescription::max_message_size), or a closed communicator. kPeerError: the peer is gone.
  // last_error() says which.
  Posted isend(const void* data, std::size_t size, Tag tag, MemoryRegion region);
};

class RecvComm final : public Communicator {
 public:
  RecvComm(CommKey, std::shared_ptr<p2p::ContextCore> context, std::unique_ptr<p2p::Comm> comm);
  // Posts 1..kMaxRecvBuffers buffers for the next as many messages: each message goes into the
  // buffer of this call whose tag is its own, whatever order they were sent in (equal tags
  // fill their buffers in send order); one whose tag no free buffer has fails (kInvalid), and
  // one larger than its buffer fails (kTruncated), never truncated: none of it is copied in.
  // The receive always reports it; the send too where it waited for the buffer's announcement
  // (a message above what credits carry: the eager size, or LOOM_EAGER_FRAGMENTS of them; or
  // one without credits), not a message sent ahead, whose send is done once it left, as MPI's
  // and NCCL's are.
  Posted irecv(std::span<const RecvBuffer> buffers);
  // Makes data received into `buffers` visible to the device (GPUDirect RDMA): a small read
  // of a device buffer through each data rail. Where there is nothing to do (host memory
  // unless LOOM_FORCE_FLUSH is set, or LOOM_GPU_FLUSH=0) the request is done at its first test.
  Posted iflush(std::span<const RecvBuffer> buffers);
};

struct ListenerStats {
  std::uint64_t accepted = 0;
  std::uint64_t refused = 0;  // connects with a wrong nonce, version or listener
  std::string last_refusal;
};

class Listener {
 public:
  Listener(Listener&&) noexcept;
  Listener& operator=(Listener&&) noexcept;
  ~Listener();

  [[nodiscard]] const Handle& handle() const noexcept;
  // A receive communicator for the next peer that connected, or nullptr if none yet. Never
  // blocks. Throws loom::Error if setting up the communicator fails.
  std::unique_ptr<RecvComm> accept();
  // The one-sided target (loom/rma.hpp) for the next initiator that connected with
  // Context::connect_rma, or nullptr if none yet. Each kind of connect waits for its own accept.
  std::unique_ptr<RmaTarget> accept_rma();
  void close();
  [[nodiscard]] ListenerStats stats() const;

 private:
  friend class Context;
  explicit Listener(std::shared_ptr<p2p::ListenerState> state);
  std::shared_ptr<p2p::ListenerState> state_;
};

class Connector {
 public:
  Connector(Connector&&) noexcept;
  Connector& operator=(Connector&&) noexcept;
  ~Connector();

  // The send communicator once the listener accepted, nullptr before. Never blocks. Throws
  // loom::Error if the listener refused, or nothing answered within LOOM_CONNECT_TIMEOUT_MS.
  std::unique_ptr<SendComm> poll();

 private:
  friend class Context;
  explicit Connector(std::shared_ptr<p2p::ConnectorState> state);
  std::shared_ptr<p2p::ConnectorState> state_;
};

struct NicDescription {
  std::string name;  // libfabric domain
  std::string provider;
  std::string fabric;
  std::string address;
  bool endpoint_mr = false;  // registrations are per endpoint (FI_MR_ENDPOINT)
  std::string locality;      // why it is in this place: "same NUMA node", ... (several NICs)
  // CUDA memory can be registered (a loom built with CUDA, and FI_HMEM granted); why not
  // when it cannot.
  bool device_memory = false;
  std::string device_memory_note;
  // CUDA memory can be registered through a dmabuf (loom::Dmabuf; loom's own exports use it
  // too): device memory, libfabric 1.20 or later both at build and at run time, LOOM_CUDA_DMABUF,
  // and no refusal by the provider so far; why not when it cannot.
  bool dmabuf = false;
  std::string dmabuf_note;
  // The port's data rate where the provider reports it (efa, verbs, cxi); 0 where it does not.
  std::uint64_t link_speed_mbps = 0;
  // The largest message isend takes through this NIC alone: a rendezvous message is striped
  // over up to 8 writes, none longer than the provider's max_msg_size.
  std::size_t max_message_size = 0;
  // The largest message sent eagerly through this NIC: LOOM_EAGER_MAX, or less where the
  // provider takes less in one transfer or completes longer sends only once the peer took them
  // (shm: 4 KiB, so that a peer that stops cannot hold up the others' completions).
  std::size_t eager_max = 0;
  // Whether a lane through this NIC serves one direction only (shm), so that the send and
  // receive communicators to one peer hold two lanes; elsewhere they share one (LaneDescription).
  bool lanes_per_direction = false;
};

struct RailDescription {
  std::string nic;
  bool data = false;                // data rail, else control rail
  std::uint64_t bytes_sent = 0;     // tagged and untagged sends
  std::uint64_t bytes_written = 0;  // RMA writes
  std::uint64_t bytes_read = 0;     // RMA reads (flushes)
};

// A lane serves communicators of both directions (one-sided ones too), but on providers that keep
// lanes per direction (NicDescription::lanes_per_direction): a send communicator and the receive
// communicator from the same peer share one, and so one provider connection.
struct LaneDescription {
  std::uint64_t id = 0;
  std::size_t peers = 0;  // in the lane's address vectors: the peers its communicators reach
  std::size_t comms = 0;
  std::size_t send_comms = 0;  // of them, sending (two-sided send, one-sided initiator)
  std::size_t recv_comms = 0;  // receiving (two-sided receive, one-sided target)
  std::size_t retired = 0;  // closed communicators kept until the provider returns their operations
  std::size_t endpoints = 0;
  std::size_t registrations = 0;  // fid_mr objects (per endpoint under FI_MR_ENDPOINT)
  std::size_t registered_bytes = 0;
  std::uint64_t registrations_shared = 0;
  std::uint64_t registrations_made = 0;
  // The context's regions (Context::register_memory) registered on this lane: those its
  // communicators used.
  std::size_t context_regions = 0;
  // Control messages for this lane's communicators that rode inside a data message from the
  // peer's send communicator (LOOM_CARRY_CONTROL) instead of arriving on its control rails.
  std::uint64_t carried_control = 0;
  // The eager buffers of the lane's pool (README, Protocols; opened by its first receive
  // communicator that grants credits), and how many of them are posted to the provider now
  // (receive-queue entries of data rail 0's endpoint): about the credits its communicators hold,
  // not the whole pool.
  std::size_t eager_buffers = 0;
  std::size_t eager_buffers_posted = 0;
  std::vector<RailDescription> rails;
};

struct ContextStats {
  std::vector<LaneDescription> lanes;
  std::vector<std::pair<std::string, std::size_t>> endpoints_per_nic;  // lanes' endpoints
  std::uint64_t lanes_opened = 0;
  // Lanes their last communicator left whose endpoints stay open until their last control
  // messages (a close notice waiting for the provider to reach the peer) are out, or
  // LOOM_PEER_TIMEOUT_MS passed. Not in `lanes`.
  std::size_t closing_lanes = 0;
};

// A context's region (Context::register_memory), owned: deregistered when it is destroyed or
// reset. The handle then names nothing at once, and each lane lets go of its registration when
// the last request that uses it there ended. Move-only; it keeps its context's core alive, so
// it may outlive the Context object.
class Region {
 public:
  Region() = default;
  Region(Region&& other) noexcept;
  Region& operator=(Region&& other) noexcept;
  ~Region();
  Region(const Region&) = delete;
  Region& operator=(const Region&) = delete;

  // What posts take; copies of it name nothing once the region is deregistered.
  [[nodiscard]] const MemoryRegion& handle() const noexcept { return handle_; }
  operator const MemoryRegion&() const noexcept { return handle_; }  // NOLINT: a view of it
  [[nodiscard]] bool valid() const noexcept { return handle_.valid(); }
  // Deregisters now (nothing for an empty or moved-from region).
  void reset() noexcept;

 private:
  friend class Context;
  Region(std::shared_ptr<p2p::ContextCore> core, MemoryRegion handle) noexcept
      : core_(std::move(core)), handle_(handle) {}
  std::shared_ptr<p2p::ContextCore> core_;
  MemoryRegion handle_;
};

class Context {
 public:
  // Opens the NICs the configuration selects. Throws loom::Error (listing the providers that
  // exist and why each was refused when none fits).
  explicit Context(const Config& config = Config::from_env());
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  Listener listen();
  // `label` travels with the connect and is what both communicators' label() give (a rank, say):
  // the listener's side learns from it who connected.
  Connector connect(const Handle& handle, std::uint64_t label = 0);
  // A one-sided connection (loom/rma.hpp) to the listener's context, which takes it with
  // Listener::accept_rma; `label` as for connect (RmaInitiator::label, RmaTarget::label).
  RmaConnector connect_rma(const Handle& handle, std::uint64_t label = 0);

  // Registers memory once for every communicator of this context, those open now and those
  // made later: the region is taken wherever a MemoryRegion is (isend, RecvBuffer, iflush) on
  // any of them, and deregistered when the returned owner goes (or is reset). A lane registers it
  // on its rails when one of its communicators first uses it (under FI_MR_ENDPOINT bound to that
  // lane's endpoints), so the region costs provider registrations only where it is used; that first
  // post returns kInvalid, last_error() quoting the provider, if the provider refuses the
  // registration. Throws loom::Error for an empty range, or device memory no NIC of the context
  // takes. The memory must stay allocated until the region is deregistered and the requests using
  // it ended (see Communicator::register_memory).
  [[nodiscard]] Region register_memory(const void* data, std::size_t size,
                                       MemoryType type = MemoryType::kHost, int device = 0);

  [[nodiscard]] const Config& config() const noexcept;
  [[nodiscard]] std::vector<NicDescription> nics() const;
  [[nodiscard]] ContextStats stats() const;

 private:
  std::shared_ptr<p2p::ContextCore> core_;
};

}  // namespace loom
