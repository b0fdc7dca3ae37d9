// A main() for fuzz targets outside libFuzzer: replays each file named on the command line (or
// every file in a named directory) through LLVMFuzzerTestOneInput, then a fixed number of
// deterministic mutations of each (bit flips, truncations, duplicated and inserted bytes), so
// that the seed corpus of every parser runs in the ordinary test suite.
//
// Exits 0 when every input was processed; a crash, sanitizer report or failed CHECK in the
// target fails the test, as it would under libFuzzer.

#include <dirent.h>
#include <sys/stat.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

constexpr int kMutationsPerSeed = 256;

void CollectFiles(const std::string& path, std::vector<std::string>* files) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    std::fprintf(stderr, "corpus_main: cannot stat %s\n", path.c_str());
    std::exit(2);
  }
  if (!S_ISDIR(st.st_mode)) {
    files->push_back(path);
    return;
  }
  DIR* dir = opendir(path.c_str());
  if (dir == nullptr) return;
  while (dirent* entry = readdir(dir)) {
    const std::string name = entry->d_name;
    if (name == "." || name == "..") continue;
    CollectFiles(path + "/" + name, files);
  }
  closedir(dir);
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

std::string Mutate(const std::string& seed, std::mt19937_64& rng) {
  std::string s = seed;
  const int edits = 1 + static_cast<int>(rng() % 4);
  for (int e = 0; e < edits; ++e) {
    const uint64_t pick = rng() % 5;
    if (s.empty() || pick == 0) {
      s.insert(s.begin() + (s.empty() ? 0 : rng() % (s.size() + 1)), static_cast<char>(rng()));
    } else if (pick == 1) {
      s[rng() % s.size()] ^= static_cast<char>(1u << (rng() % 8));
    } else if (pick == 2) {
      s.resize(rng() % s.size());
    } else if (pick == 3) {
      const size_t at = rng() % s.size();
      const size_t len = 1 + rng() % std::min<size_t>(s.size() - at, 16);
      s.insert(at, s.substr(at, len));
    } else {
      static const char kInteresting[] = "{}[]\",:\\\0\xff\xc3-0123456789eE.";
      s[rng() % s.size()] = kInteresting[rng() % (sizeof(kInteresting) - 1)];
    }
  }
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> files;
  for (int i = 1; i < argc; ++i) CollectFiles(argv[i], &files);
  if (files.empty()) {
    std::fprintf(stderr, "corpus_main: no inputs given\n");
    return 2;
  }
  std::mt19937_64 rng(0x5eed);
  size_t runs = 0;
  for (const std::string& file : files) {
    const std::string seed = ReadFile(file);
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(seed.data()), seed.size());
    ++runs;
    for (int m = 0; m < kMutationsPerSeed; ++m) {
      const std::string input = Mutate(seed, rng);
      LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(input.data()), input.size());
      ++runs;
    }
  }
  std::printf("corpus_main: %zu seed files, %zu inputs, all processed\n", files.size(), runs);
  return 0;
}
