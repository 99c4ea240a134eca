#include "p2p/verdict.hpp"

namespace loom::p2p {

std::string explain(Verdict verdict, Side side, std::uint32_t seq, const Announcement& buffer,
                    std::uint64_t message_size, Tag message_tag) {
  const std::string message = std::to_string(seq);
  if (side == Side::kSender) {
    switch (verdict) {
      case Verdict::kRefused:
        return "isend: the peer's receive for message " + message + " failed; nothing was sent";
      case Verdict::kTooLarge:
        return "isend: message of " + std::to_string(message_size) +
               " bytes is larger than the peer's posted buffer of " + std::to_string(buffer.size) +
               " bytes (message " + message + ")";
      case Verdict::kWrongTag:
        return "isend: tag " + std::to_string(message_tag) +
               " does not match the peer's buffer tag " + std::to_string(buffer.tag) +
               " (message " + message + ")";
      case Verdict::kFits:
        break;
    }
    return {};
  }
  switch (verdict) {
    case Verdict::kRefused:
      return "irecv: message " + message + " refused";
    case Verdict::kTooLarge:
      return "irecv: message " + message + " of " + std::to_string(message_size) +
             " bytes is larger than the posted buffer of " + std::to_string(buffer.size) + " bytes";
    case Verdict::kWrongTag:
      return "irecv: message " + message + " carries tag " + std::to_string(message_tag) +
             ", the buffer expects " + std::to_string(buffer.tag);
    case Verdict::kFits:
      break;
  }
  return {};
}

}  // namespace loom::p2p
