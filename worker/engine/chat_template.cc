#include "worker/engine/chat_template.h"

namespace kvc::worker {

std::string ApplyChatTemplate(const std::vector<ChatMessage>& messages,
                              bool add_generation_prompt) {
  std::string out;
  if (!messages.empty() && messages[0].role != "system") {
    out += "<|im_start|>system\n";
    out += kSmolLmDefaultSystem;
    out += "<|im_end|>\n";
  }
  for (const ChatMessage& m : messages) {
    out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
  }
  if (add_generation_prompt) out += "<|im_start|>assistant\n";
  return out;
}

}  // namespace kvc::worker
