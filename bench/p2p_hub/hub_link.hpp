// fi_p2p_hub's link between the hub and one peer, the same code on both sides: N communicators
// each way set up at once, one verified message on each, and the socketpair messages around
// them. Also the peer process's whole life (run_peer).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "common/memory.hpp"
#include "common/oob.hpp"
#include "loom/config.hpp"
#include "loom/p2p.hpp"

namespace loom::bench {

struct HubOptions {
  std::vector<unsigned> checkpoints;  // --peers, ascending; the run forks the last
  unsigned comms = 1;                 // --comms-per-peer: send comms and receive comms each
  std::size_t size = 1u << 20;        // -S
  unsigned eager = 0;                 // --eager: small messages each way per comm before -S's
  int groups = -1;                    // --groups (-1: LOOM_NGROUPS)
  unsigned timeout_s = 120;           // --timeout: the whole run
  std::string json;                   // --json
  bool quiet = false;                 // -q

  [[nodiscard]] unsigned peers() const { return checkpoints.back(); }
};

// Receivers tell which send comm a message came from by its first byte (accept order need
// not be connect order), so one peer's comms each way fit in a byte.
inline constexpr unsigned kMaxCommsPerPeer = 256;

// The hub's and every peer's configuration: LOOM_* with --groups and --timeout on top, and
// loopback NICs only. Throws loom::Error for an invalid environment.
Config hub_config(const HubOptions& options);

// What travels on a peer's socketpair: a kind byte, then a body.
enum class HubMessage : std::uint8_t {
  kHandle = 'H',  // a listen handle: the peer's first message, the hub's answer
  kOk = 'K',      // peer: every message verified
  kFailed = 'E',  // peer: what failed, as text
  kFinish = 'F',  // hub: close and exit (also instead of the handle when the hub gave up)
};
void send_message(Oob& oob, HubMessage kind, std::span<const std::byte> body = {});
void send_text(Oob& oob, HubMessage kind, const std::string& text);
// Throws std::runtime_error on an empty or unknown message (and as Oob::receive does).
std::pair<HubMessage, std::vector<std::byte>> receive_message(Oob& oob);
std::string text_of(const std::vector<std::byte>& body);

// Called in every pass of the polling loops with the comms (or messages) done and the total;
// throws to give up (a peer's failure report, a deadline).
using Watch = std::function<void(std::size_t done, std::size_t total)>;

struct HubLink {
  std::vector<std::unique_ptr<SendComm>> send;  // by connector, in connect order
  std::vector<std::unique_ptr<RecvComm>> recv;  // in accept order
  // Wall time of the calls that set comms up: each Context::connect(), each connector's
  // first poll() (it joins or opens the lane and sends the connect) and the poll() that
  // returned its comm, each accept() that returned a comm.
  double setup_us = 0;

  // Closes every comm; returns what failed ("" when nothing did).
  std::string close() noexcept;
};

// `n` connects to `remote` and `n` accepts on `listener`, polled in one loop until all 2n
// comms are there. Throws std::runtime_error naming the call and the comm.
HubLink open_link(Context& context, Listener& listener, const Handle& remote, unsigned n,
                  const Watch& watch);

enum class Direction : std::uint8_t { kToPeer = 0, kToHub = 1 };

// One message of `size` bytes on each comm of `link` each way, every byte checked. Send comm
// i of peer `peer` sends the pattern of (peer, i, `out`); each message received must carry the
// pattern of (peer, j, the other direction) for a j no other message of this link carried.
// The buffers hold n messages each (n = comms each way); they are registered for the exchange
// only. Throws std::runtime_error naming the comm and what went wrong.
void exchange(HubLink& link, unsigned peer, Direction out, std::size_t size,
              HostBuffer& send_buffer, HostBuffer& recv_buffer, const Watch& watch);

// `options.eager` rounds of exchange() with small messages (8 B, 16 B, ... 16 KiB, again from
// 8 B; at most -S bytes), then one of options.size: the traffic of a peer, both ends alike.
void exchange_traffic(HubLink& link, unsigned peer, Direction out, const HubOptions& options,
                      HostBuffer& send_buffer, HostBuffer& recv_buffer, const Watch& watch);

// Peer `peer` (1-based), in a child forked before any loom::Context: listens, sends its handle,
// takes the hub's, opens its link and exchanges, reports, waits for finish, closes. Returns
// the exit code; failures are reported to the hub (stderr when the hub is gone).
int run_peer(const HubOptions& options, const Config& config, unsigned peer, Oob& oob,
             std::chrono::steady_clock::time_point deadline);

}  // namespace loom::bench
