// Shell-like splitting of an arguments file, so that a user can paste the launch script they run.
#include "stratagem/error.hpp"
#include "stratagem/interop.hpp"

namespace stratagem::interop {

std::vector<std::string> split_command_line(const std::string& text, const std::string& source) {
  std::vector<std::string> out;
  std::string token;
  bool in_token = false;
  char quote = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    const char ch = text[i];
    if (quote) {
      if (ch == quote)
        quote = 0;
      else if (ch == '\\' && quote == '"' && i + 1 < text.size())
        token += text[++i];
      else
        token += ch;
      continue;
    }
    if (ch == '\\' && i + 1 < text.size()) {
      // Backslash-newline continues the line; any other escaped character is literal.
      if (text[i + 1] != '\n') token += text[i + 1], in_token = true;
      ++i;
      continue;
    }
    if (ch == '#' && !in_token) {
      while (i < text.size() && text[i] != '\n') ++i;
      continue;
    }
    if (ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r') {
      if (in_token) out.push_back(token), token.clear(), in_token = false;
      continue;
    }
    if (ch == '"' || ch == '\'') {
      quote = ch;
      in_token = true;
      continue;
    }
    token += ch;
    in_token = true;
  }
  if (quote) throw InputError(source + ": unterminated " + std::string(1, quote) + " quote");
  if (in_token) out.push_back(token);
  return out;
}

}  // namespace stratagem::interop
