// The listener's side of malformed and forged connects, sent by another process that speaks
// the bootstrap protocol directly: each refused with a reason and counted, and none stops the
// genuine connect that comes after.
#include <memory>

#include <catch2/catch.hpp>

#include "p2p/bootstrap.hpp"
#include "p2p/context_core.hpp"
#include "p2p/messages.hpp"
#include "support/p2p_pair.hpp"

namespace loom::test {
namespace {

using p2p::ConnectMessage;
using p2p::ContextCore;

// A connect as a genuine connector would build it for `handle`, from `forger`'s addresses.
ConnectMessage connect_for(const p2p::HandleData& target, ContextCore& forger) {
  auto reply_to = forger.bootstrap().address();
  ConnectMessage message{.listener = target.listener,
                         .nonce = target.nonce,
                         .context = forger.id(),
                         .connect_id = 77,
                         .reply_to = {reply_to.begin(), reply_to.end()},
                         .lane = {}};
  message.lane.data.push_back(message.reply_to);
  message.lane.control.push_back(message.reply_to);
  return message;
}

void send_raw(ContextCore& forger, const p2p::HandleData& target, std::span<const std::byte> body) {
  std::lock_guard lock(forger.bootstrap().mutex());
  forger.bootstrap().send(target.addresses.front(), p2p::MessageType::kConnect, body);
}

void send_connect(ContextCore& forger, const p2p::HandleData& target,
                  const ConnectMessage& message) {
  std::byte body[mux::kMaxControlBody];
  const std::size_t length = p2p::encode_connect(message, body);
  require(length != 0, "encode_connect failed");
  send_raw(forger, target, {body, length});
}

enum Step : int { kMagic = 1, kVersion, kNonce, kDone };

void listener_role(Channel& channel) {
  Context context(test_config(1));
  Listener listener = context.listen();
  send_handle(channel, listener.handle());
  // Each forged connect is refused, counted against this listener, and names its reason.
  const char* reasons[] = {"", "wrong magic", "protocol version", "wrong nonce"};
  for (int step = kMagic; step <= kNonce; ++step) {
    require(channel.recv_value<int>() == step, "steps out of order");
    poll_until([&] { return listener.stats().refused >= static_cast<std::uint64_t>(step); },
               [&] { require(listener.accept() == nullptr, "a forged connect was accepted"); },
               "refusal " + std::to_string(step));
    const auto stats = listener.stats();
    require(stats.refused == static_cast<std::uint64_t>(step), "refusal count");
    require(stats.last_refusal.find(reasons[step]) != std::string::npos,
            "refusal reason: " + stats.last_refusal);
    channel.send_value(step);
  }
  // A connect naming another listener, then bytes that do not decode: this listener sees
  // neither, and nothing was half set up.
  require(channel.recv_value<int>() == kDone, "steps out of order");
  require(context.stats().lanes.empty(), "a forged connect left a lane behind");

  std::unique_ptr<RecvComm> in = accept_one(listener);
  std::vector<std::byte> buffer(70000);
  const CloseOnUnwind guard{in.get()};
  MemoryRegion region = in->register_memory(buffer.data(), buffer.size());
  RecvBuffer target{buffer.data(), buffer.size(), 5, region};
  Request request;
  require(post_into(in->irecv({&target, 1}), request) == Status::kOk, in->last_error());
  require(finish(*in, request) == buffer.size(), "delivered size");
  const std::string error = check_pattern(buffer, 91);
  require(error.empty(), error);
  require(listener.stats().accepted == 1 && listener.stats().refused == 3,
          "accepted " + std::to_string(listener.stats().accepted) + ", refused " +
              std::to_string(listener.stats().refused));
  channel.barrier();
}

void forger_role(Channel& channel) {
  const Handle handle = recv_handle(channel);
  p2p::HandleData target;
  require(p2p::decode_handle(handle.view(), target) == nullptr, "handle does not decode");
  {
    auto forger = std::make_shared<ContextCore>(test_config(1));
    auto forge = [&](int step, const ConnectMessage& message) {
      send_connect(*forger, target, message);
      channel.send_value(step);
      poll_until([&] { return channel.readable(); },
                 [&] {
                   std::lock_guard lock(forger->bootstrap().mutex());
                   forger->bootstrap().progress();
                 },
                 "the listener's verdict");
      require(channel.recv_value<int>() == step, "steps out of order");
    };
    ConnectMessage message = connect_for(target, *forger);
    message.magic ^= 0x01010101;
    forge(kMagic, message);
    message = connect_for(target, *forger);
    message.version = p2p::kProtocolVersion + 1;
    forge(kVersion, message);
    message = connect_for(target, *forger);
    message.nonce ^= 1;
    forge(kNonce, message);

    message = connect_for(target, *forger);
    message.listener += 1000;
    send_connect(*forger, target, message);
    std::byte garbage[40];
    for (std::size_t i = 0; i < sizeof garbage; ++i) garbage[i] = std::byte(i * 29 + 3);
    send_raw(*forger, target, garbage);
    channel.send_value(int{kDone});
  }
  // The genuine connector, through the public API.
  Context context(test_config(1));
  std::unique_ptr<SendComm> out = connect_one(context, handle);
  std::vector<std::byte> buffer(70000);
  const CloseOnUnwind guard{out.get()};
  fill_pattern(buffer, 91);
  MemoryRegion region = out->register_memory(buffer.data(), buffer.size());
  Request request;
  require(post_into(out->isend(buffer.data(), buffer.size(), 5, region), request) == Status::kOk,
          out->last_error());
  finish(*out, request);
  channel.barrier();
}

}  // namespace

TEST_CASE("p2p listener refuses forged connects and still accepts the genuine one", "[pair]") {
  auto failure = run_pair(listener_role, forger_role);
  INFO(failure);
  CHECK(failure.empty());
}

}  // namespace loom::test
