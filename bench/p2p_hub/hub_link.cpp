#include "p2p_hub/hub_link.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <stdexcept>

namespace loom::bench {
namespace {

using Clock = std::chrono::steady_clock;

constexpr Tag kTag = 0x4855B;

double micros_since(Clock::time_point start) {
  return std::chrono::duration<double, std::micro>(Clock::now() - start).count();
}

// splitmix64's finalizer.
std::uint64_t mix(std::uint64_t x) {
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// The message of comm `comm` of peer `peer` in direction `dir`: byte 0 is
// (comm + 7 peer + 101 dir) mod 256, distinct for the comms of one peer and direction (at most
// kMaxCommsPerPeer), so that the receiver can tell which send comm a message came from; the
// others come 8 at a time from a hash of (peer, comm, dir, i / 8), so no two messages of a run
// are alike beyond their first byte.
struct Pattern {
  std::uint8_t first;
  std::uint64_t key;

  Pattern(unsigned peer, std::size_t comm, Direction dir)
      : first(static_cast<std::uint8_t>(comm + peer * 7 + static_cast<unsigned>(dir) * 101)),
        key(mix((std::uint64_t{peer} << 32) ^ (std::uint64_t{comm} << 1) ^
                static_cast<std::uint64_t>(dir))) {}

  void fill(std::byte* data, std::size_t size) const {
    for (std::size_t i = 0; i < size; i += 8) {
      const std::uint64_t word = mix(key + i / 8);
      std::memcpy(data + i, &word, std::min<std::size_t>(8, size - i));
    }
    if (size > 0) data[0] = static_cast<std::byte>(first);
  }

  // The first byte that differs, or `size`.
  [[nodiscard]] std::size_t mismatch(const std::byte* data, std::size_t size) const {
    if (size > 0 && data[0] != static_cast<std::byte>(first)) return 0;
    std::byte expected[8];
    for (std::size_t i = 0; i < size; i += 8) {
      const std::uint64_t word = mix(key + i / 8);
      std::memcpy(expected, &word, sizeof expected);
      const std::size_t n = std::min<std::size_t>(8, size - i);
      for (std::size_t b = (i == 0 ? 1 : 0); b < n; ++b) {
        if (data[i + b] != expected[b]) return i + b;
      }
    }
    return size;
  }
};

std::string comm_name(bool send, std::size_t index) {
  return (send ? "send comm " : "receive comm ") + std::to_string(index);
}

[[noreturn]] void fail(const std::string& comm, const char* call, const std::string& why) {
  throw std::runtime_error(comm + ": " + call + ": " + why);
}

}  // namespace

Config hub_config(const HubOptions& options) {
  Config config = Config::from_env();
  if (options.groups >= 0) config.ngroups = static_cast<unsigned>(options.groups);
  config.loopback_only = true;
  config.connect_timeout_ms = options.timeout_s * 1000;
  config.validate();
  return config;
}

void send_message(Oob& oob, HubMessage kind, std::span<const std::byte> body) {
  std::vector<std::byte> bytes(1 + body.size());
  bytes[0] = static_cast<std::byte>(kind);
  std::copy(body.begin(), body.end(), bytes.begin() + 1);
  oob.send(bytes);
}

void send_text(Oob& oob, HubMessage kind, const std::string& text) {
  send_message(oob, kind, std::as_bytes(std::span(text.data(), text.size())));
}

std::pair<HubMessage, std::vector<std::byte>> receive_message(Oob& oob) {
  std::vector<std::byte> bytes = oob.receive();
  if (bytes.empty()) throw std::runtime_error("bootstrap: empty message");
  const auto kind = static_cast<HubMessage>(bytes[0]);
  switch (kind) {
    case HubMessage::kHandle:
    case HubMessage::kOk:
    case HubMessage::kFailed:
    case HubMessage::kFinish:
      break;
    default:
      throw std::runtime_error("bootstrap: unknown message kind " +
                               std::to_string(static_cast<unsigned>(bytes[0])));
  }
  return {kind, std::vector<std::byte>(bytes.begin() + 1, bytes.end())};
}

std::string text_of(const std::vector<std::byte>& body) {
  return {reinterpret_cast<const char*>(body.data()), body.size()};
}

std::string HubLink::close() noexcept {
  std::string failed;
  auto close_all = [&](auto& comms, bool send) {
    for (std::size_t i = 0; i < comms.size(); ++i) {
      try {
        comms[i]->close();
      } catch (const std::exception& e) {
        failed += (failed.empty() ? "" : "; ") + comm_name(send, i) + ": close: " + e.what();
      }
    }
    comms.clear();
  };
  close_all(send, true);
  close_all(recv, false);
  return failed;
}

HubLink open_link(Context& context, Listener& listener, const Handle& remote, unsigned n,
                  const Watch& watch) {
  HubLink link;
  link.send.resize(n);
  std::vector<Connector> connectors;
  connectors.reserve(n);
  std::vector<bool> polled(n, false);
  std::size_t sent = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const auto start = Clock::now();
    try {
      connectors.push_back(context.connect(remote));
    } catch (const Error& e) {
      fail(comm_name(true, i), "connect", e.what());
    }
    link.setup_us += micros_since(start);
  }
  while (sent < n || link.recv.size() < n) {
    for (std::size_t i = 0; i < n; ++i) {
      if (link.send[i]) continue;
      const auto start = Clock::now();
      std::unique_ptr<SendComm> comm;
      try {
        comm = connectors[i].poll();
      } catch (const Error& e) {
        fail(comm_name(true, i), "Connector::poll", e.what());
      }
      if (comm || !polled[i]) link.setup_us += micros_since(start);
      polled[i] = true;
      if (comm) {
        link.send[i] = std::move(comm);
        ++sent;
      }
    }
    if (link.recv.size() < n) {
      const auto start = Clock::now();
      std::unique_ptr<RecvComm> comm;
      try {
        comm = listener.accept();
      } catch (const Error& e) {
        fail(comm_name(false, link.recv.size()), "Listener::accept", e.what());
      }
      if (comm) {
        link.setup_us += micros_since(start);
        link.recv.push_back(std::move(comm));
      }
    }
    watch(sent + link.recv.size(), 2 * std::size_t{n});
  }
  return link;
}

void exchange(HubLink& link, unsigned peer, Direction out, std::size_t size,
              HostBuffer& send_buffer, HostBuffer& recv_buffer, const Watch& watch) {
  const Direction in = out == Direction::kToPeer ? Direction::kToHub : Direction::kToPeer;
  const std::size_t n = link.send.size();
  std::vector<MemoryRegion> send_regions(n), recv_regions(n);
  for (std::size_t i = 0; i < n; ++i) {
    Pattern(peer, i, out).fill(send_buffer.data() + i * size, size);
    std::memset(recv_buffer.data() + i * size, 0, size);
    try {
      send_regions[i] = link.send[i]->register_memory(send_buffer.data() + i * size, size);
    } catch (const Error& e) {
      fail(comm_name(true, i), "register_memory", e.what());
    }
    try {
      recv_regions[i] = link.recv[i]->register_memory(recv_buffer.data() + i * size, size);
    } catch (const Error& e) {
      fail(comm_name(false, i), "register_memory", e.what());
    }
  }
  // Receives first: a peer's message then finds its buffer posted.
  struct Pending {
    Communicator* comm;
    Request request;
    bool send;
    std::size_t index;
    std::size_t delivered;
  };
  std::vector<Pending> pending;
  for (std::size_t i = 0; i < n; ++i) {
    const RecvBuffer buffer{recv_buffer.data() + i * size, size, kTag, recv_regions[i]};
    const auto [status, request] = link.recv[i]->irecv({&buffer, 1});
    if (status != Status::kOk) {
      fail(comm_name(false, i), "irecv",
           std::string(to_string(status)) + ": " + link.recv[i]->last_error());
    }
    pending.push_back({link.recv[i].get(), request, false, i, 0});
  }
  for (std::size_t i = 0; i < n; ++i) {
    const auto [status, request] =
        link.send[i]->isend(send_buffer.data() + i * size, size, kTag, send_regions[i]);
    if (status != Status::kOk) {
      fail(comm_name(true, i), "isend",
           std::string(to_string(status)) + ": " + link.send[i]->last_error());
    }
    pending.push_back({link.send[i].get(), request, true, i, 0});
  }
  for (std::size_t left = pending.size(); left > 0;) {
    for (Pending& p : pending) {
      if (!p.request.valid()) continue;
      const Status status = p.comm->test(p.request, {&p.delivered, 1});
      if (status == Status::kInProgress) continue;
      if (status != Status::kOk) {
        fail(comm_name(p.send, p.index), "test",
             std::string(to_string(status)) + ": " + p.comm->last_error());
      }
      p.request = {};
      --left;
    }
    watch(pending.size() - left, pending.size());
  }
  std::vector<bool> seen(n, false);
  const auto base = Pattern(peer, 0, in).first;
  for (const Pending& p : pending) {
    if (p.send) continue;
    const std::string name = comm_name(false, p.index);
    if (p.delivered != size) {
      fail(name, "verify",
           std::to_string(p.delivered) + " bytes delivered, " + std::to_string(size) + " sent");
    }
    const std::byte* data = recv_buffer.data() + p.index * size;
    const std::size_t from = static_cast<std::uint8_t>(static_cast<unsigned>(data[0]) - base);
    if (from >= n || seen[from]) {
      fail(name, "verify",
           "byte 0 is " + std::to_string(static_cast<unsigned>(data[0])) +
               ", which names no send comm of this peer not heard from yet");
    }
    seen[from] = true;
    const std::size_t wrong = Pattern(peer, from, in).mismatch(data, size);
    if (wrong != size) {
      fail(name, "verify",
           "byte " + std::to_string(wrong) + " of the message from the peer's send comm " +
               std::to_string(from) + " is wrong");
    }
  }
  for (std::size_t i = 0; i < n; ++i) {
    link.send[i]->deregister(send_regions[i]);
    link.recv[i]->deregister(recv_regions[i]);
  }
}

void exchange_traffic(HubLink& link, unsigned peer, Direction out, const HubOptions& options,
                      HostBuffer& send_buffer, HostBuffer& recv_buffer, const Watch& watch) {
  for (unsigned k = 0; k < options.eager; ++k) {
    const std::size_t size = std::min(options.size, std::size_t{8} << (k % 12));
    exchange(link, peer, out, size, send_buffer, recv_buffer, watch);
  }
  exchange(link, peer, out, options.size, send_buffer, recv_buffer, watch);
}

int run_peer(const HubOptions& options, const Config& config, unsigned peer, Oob& oob,
             std::chrono::steady_clock::time_point deadline) {
  std::string step = "context";
  // Declared before the context and comms, which may write into them until they are closed.
  HostBuffer send_buffer;
  HostBuffer recv_buffer;
  try {
    Context context(config);
    step = "listen";
    Listener listener = context.listen();
    send_message(oob, HubMessage::kHandle, listener.handle().view());
    step = "waiting for the hub's handle";
    auto [kind, body] = receive_message(oob);
    if (kind == HubMessage::kFinish) return 0;  // the hub gave up before this peer
    if (kind != HubMessage::kHandle) throw std::runtime_error("unexpected message");
    const Handle hub = Handle::from_bytes(body);
    const Watch watch = [&](std::size_t, std::size_t) {
      if (Clock::now() > deadline) throw std::runtime_error("--timeout expired");
    };
    step = "connect/accept";
    HubLink link = open_link(context, listener, hub, options.comms, watch);
    step = "transfer";
    send_buffer.assign(options.comms * options.size, std::byte{0});
    recv_buffer.assign(options.comms * options.size, std::byte{0});
    exchange_traffic(link, peer, Direction::kToHub, options, send_buffer, recv_buffer, watch);
    send_message(oob, HubMessage::kOk);
    step = "waiting for finish";
    if (receive_message(oob).first != HubMessage::kFinish) {
      throw std::runtime_error("unexpected message");
    }
    step = "close";
    if (const std::string failed = link.close(); !failed.empty()) {
      throw std::runtime_error(failed);
    }
    return 0;
  } catch (const std::exception& e) {
    const std::string text = step + ": " + e.what();
    try {
      send_text(oob, HubMessage::kFailed, text);
    } catch (const std::exception&) {
      std::fprintf(stderr, "fi_p2p_hub (peer %u): %s\n", peer, text.c_str());
    }
    return 1;
  }
}

}  // namespace loom::bench
