// SmolLM2's chat template (ChatML), the GGUF tokenizer.chat_template written out in C++ rather
// than interpreted (no Jinja here): a default system turn when the first message is not from
// the system, then "<|im_start|>{role}\n{content}<|im_end|>\n" per message.
#pragma once

#include <string>
#include <vector>

namespace kvc::worker {

struct ChatMessage {
  std::string role;  // "system", "user", "assistant"
  std::string content;
};

// The SmolLM2 default system prompt inserted by the template.
inline constexpr char kSmolLmDefaultSystem[] =
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face";

// Renders messages; with `add_generation_prompt`, ends with "<|im_start|>assistant\n".
std::string ApplyChatTemplate(const std::vector<ChatMessage>& messages, bool add_generation_prompt);

}  // namespace kvc::worker
