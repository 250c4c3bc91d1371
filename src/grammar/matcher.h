// Matching a Grammar one byte at a time, and the per-step token mask over a vocabulary.
//
// Parser state: a set of stacks (a pushdown automaton that keeps every alternative alive). A stack
// is a chain of nodes in an arena, top first: the top names the element that consumes the next
// byte (a byte set, or a Run with its count and partial UTF-8 character), each node below the
// position to return to when the rule above it ends. Rules are expanded eagerly, so a state's tops
// are always byte-consuming; `complete` says a stack ran off the bottom (the start rule is done).
//
// The mask (docs/structured-output.md): the vocabulary is sorted by bytes, so walking it in order
// with one state per prefix depth is a walk of the token trie (shared prefixes advance once, a
// dead prefix skips every token under it). Per stack, the tokens are split into those accepted or
// rejected whatever lies below the top kContextDepth nodes (computed once per distinct top and
// cached in the GrammarIndex, shared by every request with the same grammar) and the few that
// reach below them, which are walked with the real stack at each step. Computing a split skips
// the tokens that stay inside a run on top: their character count decides them (InsideTable).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "grammar/grammar.h"

namespace lilac::grammar {

// The token byte strings, sorted for the trie walk. Tokens with empty bytes (special tokens, as
// the builder passes them) are never allowed by the grammar; end_tokens are allowed exactly when
// the grammar is complete.
class Vocabulary {
 public:
  Vocabulary(std::vector<std::string> token_bytes, std::vector<int32_t> end_tokens);
  int32_t size() const { return int32_t(bytes_.size()); }
  const std::string& bytes(int32_t id) const { return bytes_[size_t(id)]; }
  const std::vector<int32_t>& end_tokens() const { return end_tokens_; }
  size_t max_token_bytes() const { return max_len_; }

  // Ids in byte order with lcp[i] = common prefix length of ids[i-1] and ids[i] (lcp[0] = 0),
  // and their bytes laid out in that order (token i: flat[offset[i], offset[i + 1])), so a walk
  // reads memory in sequence instead of chasing one string per token.
  struct SortedList {
    std::vector<int32_t> ids;
    std::vector<uint32_t> lcp;
    std::string flat;
    std::vector<uint32_t> offset;
    // first_end[b]: one past the last position whose token starts with a byte <= b (so a walk
    // skips every token of a dead first byte at once).
    std::array<uint32_t, 256> first_end{};
    std::string_view bytes(size_t i) const {
      return std::string_view(flat).substr(offset[i], offset[i + 1] - offset[i]);
    }
  };
  const SortedList& all() const { return all_; }
  SortedList sublist(const std::vector<int32_t>& ids_in_order) const;

  // The tokens whose bytes all stay inside a run of one code-point class, and the characters they
  // need there: per position of all(), its complete characters plus one for a trailing partial
  // character that can still become one of the class, or kOutside (a byte leaves the class, or
  // the UTF-8 is invalid). Built on first use of a class (one pass over the vocabulary, split
  // over `threads`) and shared by every grammar over this vocabulary (at most 64 classes kept,
  // ~0.7 MB each on a 150k vocabulary).
  struct InsideTable {
    static constexpr uint8_t kOutside = 255;
    std::vector<uint8_t> need;
    // up_to[L], L <= levels: a bitset over ids of the tokens needing at most L characters; the
    // last one (up_to[levels + 1]) of every token inside.
    std::vector<std::vector<uint32_t>> up_to;
    // The tokens with need kOutside, listed when they are few (outside_listed: at most 1/8).
    SortedList outside;
    bool outside_listed = false;
  };
  std::shared_ptr<const InsideTable> inside_table(const CodePointClass& c, int levels,
                                                  int threads) const;

 private:
  std::vector<std::string> bytes_;
  std::vector<int32_t> end_tokens_;
  SortedList all_;
  size_t max_len_ = 0;
  mutable std::mutex inside_mutex_;
  mutable std::map<std::pair<int, std::vector<std::pair<uint32_t, uint32_t>>>,
                   std::shared_ptr<const InsideTable>>
      inside_;
};

struct StackNode {
  int32_t elem = 0;      // index into Grammar::elements
  int32_t parent = -1;   // the node below, -1: the bottom
  int32_t count = 0;     // Run: characters taken so far
  uint32_t partial = 0;  // Run: a partial UTF-8 character (0: none), see matcher.cpp
};

struct ParseState {
  std::vector<int32_t> tops;  // node ids
  bool complete = false;
};

// The per-(grammar, vocabulary) cache of context-independent token sets, shared by requests.
class GrammarIndex {
 public:
  static constexpr int kContextDepth = 4;
  static constexpr size_t kMaxEntries = 4096;  // ~80 MB at most on a 150k vocabulary
  // `context_depth`: the stack nodes a cached split looks at (kContextDepth; the benchmark varies
  // it): deeper means fewer uncertain tokens to walk per step but more distinct contexts to cache.
  // `walk_threads`: threads that share a long walk of the vocabulary for a new context, taking
  // contiguous chunks of the sorted tokens from a pool started once per process (0: up to 8, as
  // the machine has cores, for vocabularies of 8,192 tokens or more; 1 otherwise); see
  // set_parallel_walk_ms.
  GrammarIndex(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const Vocabulary> vocab,
               int context_depth = kContextDepth, int walk_threads = 0);
  const Grammar& grammar() const { return *grammar_; }
  const Vocabulary& vocab() const { return *vocab_; }

  struct Entry {
    std::vector<uint32_t> accepted_bits;  // a bitset over the vocab, or empty and:
    std::vector<int32_t> accepted_ids;
    Vocabulary::SortedList uncertain;  // to walk with the real stack
  };
  // The entry for the stack whose top is `top` in `nodes`.
  std::shared_ptr<const Entry> entry(const std::vector<StackNode>& nodes, int32_t top);
  size_t cached_entries() const;
  int walk_threads() const { return walk_threads_; }
  // A walk goes to the pool when its first chunk, walked on the calling thread, projects the whole
  // past this many milliseconds (default 0.5; 0: always, as the tests of the shared walk want).
  void set_parallel_walk_ms(double ms) { parallel_walk_ms_ = ms; }

 private:
  // Positions of vocab().all() whose token is longer than bucket_ bytes (a bucketed entry leaves
  // them uncertain), and the same as a bitset over ids.
  std::vector<uint32_t> long_positions_;
  std::vector<uint32_t> long_bits_;

  std::shared_ptr<const Grammar> grammar_;
  std::shared_ptr<const Vocabulary> vocab_;
  int32_t horizon_ = 0;  // a token has at most this many bytes (so characters)
  int context_depth_ = kContextDepth;
  int walk_threads_ = 1;
  double parallel_walk_ms_ = 0.5;
  // A run with more than this many characters left (and fewer than horizon_) shares one entry.
  static constexpr int32_t kRunBucket = 24;
  int32_t bucket_ = kRunBucket;
  mutable std::mutex mutex_;
  std::map<std::vector<int64_t>, std::shared_ptr<const Entry>> entries_;
};

// One sequence's parser: advanced by accepted tokens, asked for the next token's mask.
class Matcher {
 public:
  explicit Matcher(std::shared_ptr<GrammarIndex> index);

  // Advances by the token's bytes; false (state unchanged) when the grammar does not allow it.
  // An end token is accepted only when the grammar is complete, and leaves the matcher finished.
  bool accept_token(int32_t token);
  // Advances by raw bytes (tests, forced text); false (state unchanged) when not allowed.
  bool accept_bytes(std::string_view bytes);
  // Fills `allowed` ((vocab + 31) / 32 words): the tokens accept_token would accept.
  void fill_mask(std::span<uint32_t> allowed);
  const Vocabulary& vocab() const { return index_->vocab(); }
  bool complete() const { return state_.complete; }
  bool finished() const { return finished_; }
  // No stack left and not complete: nothing can follow (only after a rejected forced token).
  bool dead() const { return state_.tops.empty() && !state_.complete; }

 private:
  std::shared_ptr<GrammarIndex> index_;
  std::vector<StackNode> nodes_;
  ParseState state_;
  bool finished_ = false;
};

// Byte-level stepping shared by the matcher and the index (matcher.cpp).
namespace detail {
// The state at the start: the start rule expanded.
ParseState initial_state(const Grammar& g, std::vector<StackNode>& nodes);
// Advances `from` by one byte into `out` (cleared first).
void advance(const Grammar& g, std::vector<StackNode>& nodes, const ParseState& from, uint8_t b,
             ParseState& out);
enum class Verdict : uint8_t { Reject, Accept, Uncertain };
// Tokens that stay inside the run on top of the start state (list positions with need[pos] !=
// kOutside, Vocabulary::InsideTable) are not walked: those needing at most `limit` characters
// are accepted and not reported (the caller takes them from the table's bitset), those above it
// rejected when `reject_over` (no path that leaves the run can take their next byte), otherwise
// walked as any other token.
struct InsideRun {
  static constexpr uint8_t kOutside = Vocabulary::InsideTable::kOutside;
  const uint8_t* need = nullptr;
  uint32_t limit = 0;
  bool reject_over = false;
};
// Walks `list` from `start`, calling on(id, verdict) for every token not rejected, in list
// order. With `bottom_is_context`, a stack that runs off the bottom with bytes left makes the token
// Uncertain (the real stack continues below); otherwise such a path is dead.
void walk(const Grammar& g, const Vocabulary& v, const Vocabulary::SortedList& list,
          std::vector<StackNode>& nodes, const ParseState& start, bool bottom_is_context,
          const std::function<void(int32_t, Verdict)>& on);
// The same over list entries [begin, end) only (a walk shared between threads).
void walk_range(const Grammar& g, const Vocabulary& v, const Vocabulary::SortedList& list,
                size_t begin, size_t end, std::vector<StackNode>& nodes, const ParseState& start,
                bool bottom_is_context, const std::function<void(int32_t, Verdict)>& on);
}  // namespace detail

}  // namespace lilac::grammar
