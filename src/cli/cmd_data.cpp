#include <cstdio>

#include "src/cli/command.hpp"
#include "stratagem/data.hpp"
#include "stratagem/input_file.hpp"

namespace stratagem::cli {
namespace {

int run_tokenize(Args& a) {
  const bool json = a.flag("--json");
  const auto out_flag = a.output("-o");
  auto pos = a.positionals();
  a.finish();
  if (pos.size() != 1) throw InputError(a.command() + ": expected one input text file");
  if (!out_flag) throw InputError(a.command() + ": missing required flag -o");
  const std::string out = *out_flag;
  // One token a byte, and the .bin header counts tokens in an int32: 1 GiB stays below it.
  constexpr uint64_t kMaxTextBytes = uint64_t(1) << 30;
  auto tokens = tokenize_bytes(
      io::read_input_file(pos[0], kMaxTextBytes, a.command() + ": " + pos[0], "a text file"));
  if (tokens.size() < 2)
    throw InputError(a.command() + ": " + pos[0] + ": fewer than 2 bytes of text");
  if (world_rank() == 0) write_token_bin(out, tokens);
  auto ds = TokenDataset::from_tokens(std::move(tokens), out);
  if (json) {
    print_json({{"input", pos[0]},
                {"output", out},
                {"tokens", ds.size()},
                {"vocab", 256},
                {"unigram_entropy_nats", ds.unigram_entropy_nats()}});
  } else if (world_rank() == 0) {
    std::printf("%s -> %s: %lld tokens (byte-level, vocab 256), unigram entropy %.4f nats\n",
                pos[0].c_str(), out.c_str(), (long long)ds.size(), ds.unigram_entropy_nats());
  }
  return 0;
}

Register reg{{"data tokenize", "turn a text file into a byte-level token file (llm.c .bin)",
              "usage: stratagem data tokenize IN.txt -o OUT.bin [--json]\n"
              "  Every byte is one token (vocab 256); the output is llm.c's .bin format.\n",
              run_tokenize}};

}  // namespace
}  // namespace stratagem::cli
