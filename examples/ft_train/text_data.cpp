// Fortunes text loader, windows and sampler (text_data.hpp).
#include "text_data.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <system_error>

namespace monarch::ft::example {

namespace fs = std::filesystem;

namespace {

constexpr const char* kInstallHint =
    "install the text with `apt-get install fortunes fortunes-min`";

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DatasetError("cannot open fortunes file " + path.string());
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw DatasetError("cannot read fortunes file " + path.string());
  return text;
}

bool blank(const std::string& s) {
  return std::all_of(s.begin(), s.end(),
                     [](char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; });
}

}  // namespace

TextCorpus load_fortunes(const std::string& dir) {
  std::error_code ec;
  if (fs::exists(dir, ec) && !fs::is_directory(dir, ec)) {
    throw DatasetError("fortunes directory " + dir +
                       " is not a directory: --data takes a directory of fortune text files, "
                       "like /usr/share/games/fortunes");
  }
  if (!fs::is_directory(dir, ec)) {
    throw DatasetError("fortunes directory " + dir + " does not exist: " + kInstallHint);
  }
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const auto name = entry.path().filename().string();
    if (entry.is_symlink() || !entry.is_regular_file()) continue;  // *.u8 links, subdirectories
    if (ends_with(name, ".dat") || ends_with(name, ".u8")) continue;
    files.push_back(entry.path());
  }
  if (ec) throw DatasetError("cannot list fortunes directory " + dir + ": " + ec.message());
  if (files.empty()) {
    throw DatasetError("fortunes directory " + dir +
                       " holds no fortune text files: " + kInstallHint);
  }
  std::sort(files.begin(), files.end());

  TextCorpus corpus;
  corpus.files = static_cast<std::int64_t>(files.size());
  std::int64_t index = 0;  // fortunes kept so far, over all files
  auto finish = [&](std::string& fortune) {
    if (!blank(fortune)) {
      const bool held = index % kHeldOutEvery == kHeldOutEvery - 1;
      auto& out = held ? corpus.heldout : corpus.train;
      out.insert(out.end(), fortune.begin(), fortune.end());
      out.push_back(kEndOfText);
      ++(held ? corpus.heldout_fortunes : corpus.train_fortunes);
      ++index;
    }
    fortune.clear();
  };
  for (const auto& path : files) {
    const std::string text = read_file(path);
    if (text.find('\0') != std::string::npos) {  // kEndOfText must mark fortune ends only
      throw DatasetError(path.string() + " is not a fortunes text file (it holds a NUL byte)");
    }
    std::string fortune;
    std::size_t begin = 0;
    while (begin < text.size()) {
      std::size_t end = text.find('\n', begin);
      if (end == std::string::npos) end = text.size();
      std::size_t len = end - begin;
      if (len > 0 && text[begin + len - 1] == '\r') --len;
      if (len == 1 && text[begin] == '%') {
        finish(fortune);
      } else {
        fortune.append(text, begin, len);
        fortune.push_back('\n');
      }
      begin = end + 1;
    }
    finish(fortune);  // the last fortune of a file need not end with a "%" line
  }
  if (corpus.train_fortunes == 0 || corpus.heldout_fortunes == 0) {
    throw DatasetError("fortunes directory " + dir + " holds " + std::to_string(index) +
                       " fortunes, too few for a train / held-out split: " + kInstallHint);
  }
  return corpus;
}

std::array<std::int64_t, kByteVocab> byte_counts(const std::vector<std::uint8_t>& text) {
  std::array<std::int64_t, kByteVocab> counts{};
  for (auto b : text) ++counts[b];
  return counts;
}

double unigram_perplexity(const std::vector<std::uint8_t>& train,
                          const std::vector<std::uint8_t>& heldout, int seq_len) {
  const auto counts = byte_counts(train);
  const double total = static_cast<double>(train.size()) + kByteVocab;
  TextWindows windows(static_cast<std::int64_t>(heldout.size()), seq_len);
  const std::int64_t targets = windows.count() * seq_len;  // bytes 1 .. targets
  double nll = 0;
  for (std::int64_t i = 1; i <= targets; ++i) {
    nll -=
        std::log((static_cast<double>(counts[heldout[static_cast<std::size_t>(i)]]) + 1) / total);
  }
  return std::exp(nll / static_cast<double>(targets));
}

TextWindows::TextWindows(std::int64_t stream_bytes, int seq_len) : seq_len_(seq_len) {
  if (seq_len < 1)
    throw std::invalid_argument("TextWindows: seq_len " + std::to_string(seq_len) + " < 1");
  count_ = stream_bytes > 0 ? (stream_bytes - 1) / seq_len : 0;
  if (count_ < 1) {
    throw std::invalid_argument("TextWindows: a stream of " + std::to_string(stream_bytes) +
                                " bytes holds no window of " + std::to_string(seq_len + 1));
  }
}

std::int64_t TextWindows::offset(std::int64_t i) const {
  if (i < 0 || i >= count_) {
    throw std::out_of_range("TextWindows: window " + std::to_string(i) + " outside 0.." +
                            std::to_string(count_ - 1));
  }
  return i * seq_len_;
}

TextSampler::TextSampler(TextWindows windows, std::uint64_t seed)
    : windows_(windows), order_(windows.count(), seed) {}

std::int64_t TextSampler::at(std::int64_t position) {
  if (position < 0)
    throw std::invalid_argument("TextSampler: negative position " + std::to_string(position));
  return order_.at(position);
}

std::vector<std::int64_t> TextSampler::shard(std::int64_t position, std::int64_t global_batch,
                                             int slot, int slots) {
  if (slots <= 0 || slot < 0 || slot >= slots || global_batch < slots || position < 0) {
    throw std::invalid_argument("TextSampler::shard: slot " + std::to_string(slot) + " of " +
                                std::to_string(slots) + " with global batch " +
                                std::to_string(global_batch) + " at position " +
                                std::to_string(position));
  }
  std::vector<std::int64_t> out = order_.shard(position, global_batch, slot, slots);
  for (auto& w : out) w = windows_.offset(w);
  return out;
}

}  // namespace monarch::ft::example
