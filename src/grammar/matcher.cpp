// The byte-level pushdown matcher, the sorted-vocabulary walk and the token mask (matcher.h).
//
// A Run node's partial character, packed in 32 bits: bit 31 set, bits 23-25 the sequence length
// (2..4), bits 21-22 the continuation bytes still needed, bits 0-20 the code point bits so far.
// After each byte the code points still reachable, [bits << 6*need, ... | 2^(6*need) - 1] clipped
// to the shortest-form minimum, must meet the run's class: an overlong form, a surrogate, a value
// past U+10FFFF or a character the class lacks dies at its first byte that decides it, so no state
// ever waits for a continuation that cannot come.
#include "grammar/matcher.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <thread>

#include "util/error.h"

namespace lilac::grammar {

using Kind = Grammar::Kind;

Vocabulary::Vocabulary(std::vector<std::string> token_bytes, std::vector<int32_t> end_tokens)
    : bytes_(std::move(token_bytes)), end_tokens_(std::move(end_tokens)) {
  for (int32_t id = 0; id < size(); ++id)
    if (!bytes_[size_t(id)].empty()) all_.ids.push_back(id);
  std::sort(all_.ids.begin(), all_.ids.end(), [&](int32_t a, int32_t b) {
    return bytes_[size_t(a)] < bytes_[size_t(b)] ||
           (bytes_[size_t(a)] == bytes_[size_t(b)] && a < b);
  });
  all_ = sublist(all_.ids);
  for (const auto& b : bytes_) max_len_ = std::max(max_len_, b.size());
}

Vocabulary::SortedList Vocabulary::sublist(const std::vector<int32_t>& ids_in_order) const {
  SortedList out;
  out.ids = ids_in_order;
  out.lcp.resize(out.ids.size(), 0);
  out.offset.reserve(out.ids.size() + 1);
  out.offset.push_back(0);
  for (int32_t id : out.ids) {
    out.flat += bytes_[size_t(id)];
    out.offset.push_back(uint32_t(out.flat.size()));
  }
  for (size_t i = 1; i < out.ids.size(); ++i) {
    const std::string& a = bytes_[size_t(out.ids[i - 1])];
    const std::string& b = bytes_[size_t(out.ids[i])];
    const size_t n = std::min(a.size(), b.size());
    uint32_t k = 0;
    while (k < n && a[k] == b[k]) ++k;
    out.lcp[i] = k;
  }
  size_t pos = 0;
  for (size_t b = 0; b < 256; ++b) {
    while (pos < out.ids.size() && uint8_t(bytes_[size_t(out.ids[pos])][0]) <= b) ++pos;
    out.first_end[b] = uint32_t(pos);
  }
  return out;
}

namespace detail {

namespace {

using Nodes = std::vector<StackNode>;

constexpr uint32_t kPartialMark = 1u << 31;
uint32_t pack(uint32_t cp, uint32_t need, uint32_t len) {
  return kPartialMark | len << 23 | need << 21 | cp;
}
uint32_t min_for_len(uint32_t len) {
  return len == 2 ? 0x80 : len == 3 ? 0x800 : 0x10000;
}
bool feasible(const CodePointClass& c, uint32_t cp, uint32_t need, uint32_t len) {
  uint32_t lo = cp << (6 * need);
  const uint32_t hi = lo | ((1u << (6 * need)) - 1);
  lo = std::max(lo, min_for_len(len));
  return lo <= hi && c.intersects(lo, hi);
}

bool same_stack(const Nodes& nodes, int32_t a, int32_t b) {
  while (a != b) {
    if (a < 0 || b < 0) return false;
    const StackNode& x = nodes[size_t(a)];
    const StackNode& y = nodes[size_t(b)];
    if (x.elem != y.elem || x.count != y.count || x.partial != y.partial) return false;
    a = x.parent;
    b = y.parent;
  }
  return true;
}

void add_top(Nodes& nodes, const StackNode& n, ParseState& out) {
  for (int32_t t : out.tops) {
    const StackNode& x = nodes[size_t(t)];
    if (x.elem == n.elem && x.count == n.count && x.partial == n.partial &&
        same_stack(nodes, x.parent, n.parent))
      return;
  }
  nodes.push_back(n);
  out.tops.push_back(int32_t(nodes.size() - 1));
}

// Makes position `pos` (with `parent` below) current: expands rules until every new top consumes
// bytes; an alternative that ends pops to the node below.
void push(const Grammar& g, Nodes& nodes, int32_t pos, int32_t parent, ParseState& out) {
  for (;;) {
    const Grammar::Element e = g.elements[size_t(pos)];
    switch (e.kind) {
      case Kind::Bytes:
        add_top(nodes, {pos, parent, 0, 0}, out);
        return;
      case Kind::Run: {
        const Grammar::Run& r = g.runs[size_t(e.arg)];
        if (r.max > 0) add_top(nodes, {pos, parent, 0, 0}, out);
        if (r.min > 0) return;
        ++pos;  // the run may be empty
        continue;
      }
      case Kind::End: {
        if (parent < 0) {
          out.complete = true;
          return;
        }
        const StackNode p = nodes[size_t(parent)];
        pos = p.elem;
        parent = p.parent;
        continue;
      }
      case Kind::Ref: {
        const int32_t ret = pos + 1;
        int32_t below = parent;
        if (g.elements[size_t(ret)].kind != Kind::End) {  // a rule in tail position returns
          nodes.push_back({ret, parent, 0, 0});           // straight to our parent
          below = int32_t(nodes.size() - 1);
        }
        for (int32_t alt : g.rules[size_t(e.arg)]) push(g, nodes, alt, below, out);
        return;
      }
    }
  }
}

// One character of a run is complete: another may follow (below max), or the run may end.
void char_done(const Grammar& g, Nodes& nodes, const StackNode& n, const Grammar::Run& r,
               ParseState& out) {
  int32_t count = n.count + 1;
  if (r.max == Grammar::kUnbounded) count = std::min(count, r.min);  // canonical past min
  if (r.max == Grammar::kUnbounded || count < r.max)
    add_top(nodes, {n.elem, n.parent, count, 0}, out);
  if (n.count + 1 >= r.min) push(g, nodes, n.elem + 1, n.parent, out);
}

void step_run(const Grammar& g, Nodes& nodes, const StackNode& n, uint8_t b, ParseState& out) {
  const Grammar::Run& r = g.runs[size_t(g.elements[size_t(n.elem)].arg)];
  const CodePointClass& c = g.classes[size_t(r.cls)];
  if (n.partial == 0) {
    if (b < 0x80) {
      if (c.contains(b)) char_done(g, nodes, n, r, out);
      return;
    }
    if (b < 0xC2 || b > 0xF4) return;
    const uint32_t len = b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : 2;
    const uint32_t cp = b & (len == 2 ? 0x1Fu : len == 3 ? 0x0Fu : 0x07u);
    if (feasible(c, cp, len - 1, len))
      add_top(nodes, {n.elem, n.parent, n.count, pack(cp, len - 1, len)}, out);
    return;
  }
  if ((b & 0xC0) != 0x80) return;
  const uint32_t len = (n.partial >> 23) & 7u;
  const uint32_t need = ((n.partial >> 21) & 3u) - 1;
  const uint32_t cp = (n.partial & 0x1FFFFFu) << 6 | (b & 0x3Fu);
  if (need == 0) {
    if (cp >= min_for_len(len) && c.contains(cp)) char_done(g, nodes, n, r, out);
    return;
  }
  if (feasible(c, cp, need, len))
    add_top(nodes, {n.elem, n.parent, n.count, pack(cp, need, len)}, out);
}

// The state once the run at `node` has ended (its next element made current).
void leave_run(const Grammar& g, Nodes& nodes, int32_t node, ParseState& out) {
  out.tops.clear();
  out.complete = false;
  const StackNode n = nodes[size_t(node)];
  push(g, nodes, n.elem + 1, n.parent, out);
}

}  // namespace

ParseState initial_state(const Grammar& g, Nodes& nodes) {
  ParseState s;
  for (int32_t alt : g.rules[size_t(g.root)]) push(g, nodes, alt, -1, s);
  return s;
}

void advance(const Grammar& g, Nodes& nodes, const ParseState& from, uint8_t b, ParseState& out) {
  out.tops.clear();
  out.complete = false;
  for (int32_t t : from.tops) {
    const StackNode n = nodes[size_t(t)];
    const Grammar::Element e = g.elements[size_t(n.elem)];
    if (e.kind == Kind::Bytes) {
      if (g.byte_in(e.arg, b)) push(g, nodes, n.elem + 1, n.parent, out);
    } else {
      step_run(g, nodes, n, b, out);
    }
  }
}

namespace {

// The walk over list positions [begin, end), reporting on(position, verdict) for every token not
// rejected, in list order. `hist[k]` is the state after the first k bytes of the last token
// walked; a token decided by `inside` is not walked, so the next walked token starts from its
// common prefix with the last walked one (the smallest lcp since).
template <typename OnToken>
void walk_positions(const Grammar& g, const Vocabulary& v, const Vocabulary::SortedList& list,
                    size_t begin, size_t end, Nodes& nodes, const ParseState& start,
                    bool bottom_is_context, const InsideRun* inside, OnToken&& on) {
  const size_t base = nodes.size();
  const size_t depth_max = v.max_token_bytes() + 1;
  // Per depth k (bytes consumed of the current token): the state, the node count before it was
  // computed, and whether a stack ran off the bottom at some depth <= k.
  std::vector<ParseState> hist(depth_max + 1);
  std::vector<size_t> mark(depth_max + 1, base);
  std::vector<char> bottom(depth_max + 1, 0);
  hist[0] = start;
  bottom[0] = start.complete;
  size_t levels = 1;    // the first token of the range starts from the root
  uint32_t shared = 0;  // common prefix with the last walked token
  const size_t n = std::min(end, list.ids.size());
  for (size_t i = begin; i < n; ++i) {
    shared = i == begin ? 0 : std::min(shared, list.lcp[i]);
    if (inside && inside->need[i] != InsideRun::kOutside) {
      if (inside->need[i] <= inside->limit || inside->reject_over) continue;
    }
    const std::string_view s = list.bytes(i);
    const size_t d = std::min<size_t>(shared, levels - 1);
    shared = uint32_t(-1);
    if (d + 1 < levels) nodes.resize(mark[d + 1]);
    levels = d + 1;
    size_t k = d;
    bool dead = false;
    while (k < s.size()) {
      mark[k + 1] = nodes.size();
      advance(g, nodes, hist[k], uint8_t(s[k]), hist[k + 1]);
      bottom[k + 1] = bottom[k] || hist[k + 1].complete;
      ++k;
      if (hist[k].tops.empty() && !hist[k].complete) {
        dead = true;
        break;
      }
      levels = k + 1;
    }
    if (!dead) {
      on(i, Verdict::Accept);
      continue;
    }
    // Dead after k bytes: so is every following token that shares those k bytes.
    nodes.resize(mark[k]);
    const Verdict verdict =
        bottom_is_context && bottom[k - 1] ? Verdict::Uncertain : Verdict::Reject;
    if (verdict != Verdict::Reject) on(i, verdict);
    if (k == 1 && verdict == Verdict::Reject) {  // the whole first-byte group at once
      i = std::max<size_t>(i, std::min<size_t>(list.first_end[uint8_t(s[0])], n) - 1);
      continue;
    }
    while (i + 1 < n && list.lcp[i + 1] >= k) {
      ++i;
      if (verdict != Verdict::Reject) on(i, verdict);
    }
  }
  nodes.resize(base);
}

}  // namespace

void walk(const Grammar& g, const Vocabulary& v, const Vocabulary::SortedList& list, Nodes& nodes,
          const ParseState& start, bool bottom_is_context,
          const std::function<void(int32_t, Verdict)>& on) {
  walk_range(g, v, list, 0, list.ids.size(), nodes, start, bottom_is_context, on);
}

void walk_range(const Grammar& g, const Vocabulary& v, const Vocabulary::SortedList& list,
                size_t begin, size_t end, Nodes& nodes, const ParseState& start,
                bool bottom_is_context, const std::function<void(int32_t, Verdict)>& on) {
  walk_positions(g, v, list, begin, end, nodes, start, bottom_is_context, nullptr,
                 [&](size_t pos, Verdict verdict) { on(list.ids[pos], verdict); });
}

}  // namespace detail

namespace {

// Threads shared by every index's walks of new contexts, started on first use (as many as the
// largest walk asked for), so a walk pays no thread start-up. run() hands out chunks through an
// atomic counter: the caller and the helpers that are free take chunks until none is left, so a
// slow range does not hold the others back.
class WalkPool {
 public:
  static WalkPool& shared() {
    static WalkPool pool;
    return pool;
  }
  ~WalkPool() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    for (auto& t : threads_) t.join();
  }

  void run(size_t chunks, int helpers, const std::function<void(size_t)>& task) {
    auto job = std::make_shared<Job>();
    job->task = &task;
    job->chunks = chunks;
    helpers = std::min<int>(helpers, int(chunks) - 1);
    if (helpers > 0) {
      std::lock_guard lock(mutex_);
      while (threads_.size() < size_t(helpers)) threads_.emplace_back([this] { serve(); });
      job->tickets = helpers;
      queue_.push_back(job);
    }
    if (helpers > 0) wake_.notify_all();
    work(*job);
    std::unique_lock lock(mutex_);
    std::erase(queue_, job);  // tickets no helper took are void
    job->tickets = 0;
    done_.wait(lock, [&] { return job->active == 0; });
  }

 private:
  struct Job {
    const std::function<void(size_t)>* task = nullptr;
    size_t chunks = 0;
    std::atomic<size_t> next{0};
    int tickets = 0;  // helpers that may still join (guarded by mutex_)
    int active = 0;   // helpers working on it (guarded by mutex_)
  };

  static void work(Job& job) {
    for (size_t c = job.next.fetch_add(1); c < job.chunks; c = job.next.fetch_add(1))
      (*job.task)(c);
  }

  void serve() {
    std::unique_lock lock(mutex_);
    for (;;) {
      wake_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (stop_) return;
      std::shared_ptr<Job> job = queue_.front();
      if (--job->tickets == 0) queue_.pop_front();
      ++job->active;
      lock.unlock();
      work(*job);
      lock.lock();
      if (--job->active == 0) done_.notify_all();
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_, done_;
  std::deque<std::shared_ptr<Job>> queue_;
  std::vector<std::thread> threads_;
  bool stop_ = false;
};

// A class as the table build reads it: its ASCII members as a bitmap, and per lead byte whether
// the class holds every character that starts with it (then only the UTF-8 structure is checked:
// the JSON string class holds all of them).
struct ClassBytes {
  const CodePointClass* cls = nullptr;
  std::array<uint64_t, 2> ascii{};
  std::array<bool, 256> full_lead{};
  explicit ClassBytes(const CodePointClass& c) : cls(&c) {
    for (uint32_t b = 0; b < 0x80; ++b)
      if (c.contains(b)) ascii[b >> 6] |= uint64_t(1) << (b & 63);
    for (uint32_t b = 0xC2; b <= 0xF4; ++b) {
      const uint32_t len = b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : 2;
      const uint32_t bits = b & (len == 2 ? 0x1Fu : len == 3 ? 0x0Fu : 0x07u);
      const uint32_t lo = std::max(bits << (6 * (len - 1)), detail::min_for_len(len));
      const uint32_t hi =
          std::min((bits << (6 * (len - 1))) | ((1u << (6 * (len - 1))) - 1), 0x10FFFFu);
      if (lo > hi) continue;
      uint64_t held = 0, want = uint64_t(hi - lo + 1);
      if (lo <= 0xDFFF && hi >= 0xD800)  // surrogates are never in a class
        want -= std::min(hi, 0xDFFFu) - std::max(lo, 0xD800u) + 1;
      for (const auto& [r_lo, r_hi] : c.ranges)
        if (r_lo <= hi && r_hi >= lo) held += std::min(r_hi, hi) - std::max(r_lo, lo) + 1;
      full_lead[b] = held == want;
    }
  }
};

// The bytes a lead's first continuation may take in well-formed UTF-8 (no overlong form, no
// surrogate, nothing past U+10FFFF).
bool first_continuation_ok(uint8_t lead, uint8_t b) {
  switch (lead) {
    case 0xE0:
      return b >= 0xA0 && b <= 0xBF;
    case 0xED:
      return b >= 0x80 && b <= 0x9F;
    case 0xF0:
      return b >= 0x90 && b <= 0xBF;
    case 0xF4:
      return b >= 0x80 && b <= 0x8F;
    default:
      return (b & 0xC0) == 0x80;
  }
}

// The characters a token needs inside a run of class `c` (InsideRun's need), stepping its UTF-8
// as step_run does.
uint8_t inside_need(const ClassBytes& k, std::string_view s) {
  const CodePointClass& c = *k.cls;
  uint32_t chars = 0, cp = 0, need = 0, len = 0;
  uint8_t lead = 0;
  for (char ch : s) {
    const uint8_t b = uint8_t(ch);
    if (need == 0) {
      if (b < 0x80) {
        if (!(k.ascii[b >> 6] >> (b & 63) & 1u)) return detail::InsideRun::kOutside;
        ++chars;
        continue;
      }
      if (b < 0xC2 || b > 0xF4) return detail::InsideRun::kOutside;
      lead = b;
      len = b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : 2;
      cp = b & (len == 2 ? 0x1Fu : len == 3 ? 0x0Fu : 0x07u);
      need = len - 1;
      if (!k.full_lead[b] && !detail::feasible(c, cp, need, len))
        return detail::InsideRun::kOutside;
      continue;
    }
    if (k.full_lead[lead]) {  // the structure decides: every well-formed character is in
      if (need == len - 1 ? !first_continuation_ok(lead, b) : (b & 0xC0) != 0x80)
        return detail::InsideRun::kOutside;
      if (--need == 0) ++chars;
      continue;
    }
    if ((b & 0xC0) != 0x80) return detail::InsideRun::kOutside;
    cp = cp << 6 | (b & 0x3Fu);
    if (--need == 0) {
      if (cp < detail::min_for_len(len) || !c.contains(cp)) return detail::InsideRun::kOutside;
      ++chars;
    } else if (!detail::feasible(c, cp, need, len)) {
      return detail::InsideRun::kOutside;
    }
  }
  if (need > 0) ++chars;  // a partial character takes the run's next place
  return chars < detail::InsideRun::kOutside ? uint8_t(chars) : detail::InsideRun::kOutside;
}

}  // namespace

std::shared_ptr<const Vocabulary::InsideTable> Vocabulary::inside_table(const CodePointClass& c,
                                                                        int levels,
                                                                        int threads) const {
  std::lock_guard lock(inside_mutex_);  // one build at a time (a new class is rare)
  auto key = std::make_pair(levels, c.ranges);
  if (auto it = inside_.find(key); it != inside_.end()) return it->second;
  auto table = std::make_shared<InsideTable>();
  const size_t n = all_.ids.size(), parts = size_t(std::max(1, threads));
  table->need.resize(n);
  const ClassBytes class_bytes(c);
  const std::function<void(size_t)> fill = [&](size_t part) {
    for (size_t pos = n * part / parts; pos < n * (part + 1) / parts; ++pos)
      table->need[pos] = inside_need(class_bytes, all_.bytes(pos));
  };
  if (parts == 1)
    fill(0);
  else
    WalkPool::shared().run(parts, int(parts) - 1, fill);
  const size_t words = (bytes_.size() + 31) / 32;
  table->up_to.assign(size_t(levels) + 2, std::vector<uint32_t>(words, 0u));
  for (size_t pos = 0; pos < n; ++pos) {  // each token in its own level, then running ORs
    const uint8_t need = table->need[pos];
    if (need == InsideTable::kOutside) continue;
    const int32_t id = all_.ids[pos];
    table->up_to[std::min<size_t>(need, size_t(levels) + 1)][size_t(id) / 32] |= 1u << (id % 32);
  }
  for (size_t level = 1; level < table->up_to.size(); ++level)
    for (size_t w = 0; w < words; ++w) table->up_to[level][w] |= table->up_to[level - 1][w];
  std::vector<int32_t> outside;
  for (size_t pos = 0; pos < n; ++pos)
    if (table->need[pos] == InsideTable::kOutside) outside.push_back(all_.ids[pos]);
  table->outside_listed = outside.size() <= n / 8;  // else walking them all costs as much
  if (table->outside_listed) table->outside = sublist(outside);
  if (inside_.size() >= 64) inside_.clear();  // bounded: patterns bring their own classes
  return inside_.emplace(std::move(key), std::move(table)).first->second;
}

GrammarIndex::GrammarIndex(std::shared_ptr<const Grammar> grammar,
                           std::shared_ptr<const Vocabulary> vocab, int context_depth,
                           int walk_threads)
    : grammar_(std::move(grammar)),
      vocab_(std::move(vocab)),
      context_depth_(std::max(1, context_depth)) {
  horizon_ = int32_t(std::max<size_t>(vocab_->max_token_bytes(), 1));
  bucket_ = std::min(kRunBucket, horizon_ / 2);
  if (walk_threads > 0)
    walk_threads_ = walk_threads;
  else if (vocab_->size() >= 8192)
    walk_threads_ = int(std::clamp(std::thread::hardware_concurrency(), 1u, 8u));
  const Vocabulary::SortedList& all = vocab_->all();
  long_bits_.assign((size_t(vocab_->size()) + 31) / 32, 0u);
  for (size_t pos = 0; pos < all.ids.size(); ++pos) {
    if (all.offset[pos + 1] - all.offset[pos] <= uint32_t(bucket_)) continue;
    long_positions_.push_back(uint32_t(pos));
    long_bits_[size_t(all.ids[pos]) / 32] |= 1u << (all.ids[pos] % 32);
  }
}

size_t GrammarIndex::cached_entries() const {
  std::lock_guard lock(mutex_);
  return entries_.size();
}

std::shared_ptr<const GrammarIndex::Entry> GrammarIndex::entry(const std::vector<StackNode>& nodes,
                                                               int32_t top) {
  // The key: the top kContextDepth nodes (a run's count as what it still allows within one
  // token's reach), and whether the chain ends at the real bottom.
  std::vector<int64_t> key;
  std::vector<StackNode> chain;
  bool bucketed = false;
  int32_t at = top;
  for (int depth = 0; depth < context_depth_ && at >= 0; ++depth) {
    StackNode n = nodes[size_t(at)];
    key.push_back(n.elem);
    if (depth == 0 && grammar_->elements[size_t(n.elem)].kind == Kind::Run) {
      const Grammar::Run& r = grammar_->runs[size_t(grammar_->elements[size_t(n.elem)].arg)];
      // Characters the run may still take: past the longest token it makes no difference; from
      // bucket_ on, one entry serves every count, its tokens longer than bucket_ bytes (the only
      // ones a count above bucket_ can limit) left uncertain, so walked with the real count.
      int64_t to_max = horizon_;
      if (r.max != Grammar::kUnbounded) {
        const int64_t left = r.max - n.count;
        to_max = left >= horizon_ ? horizon_ : left > bucket_ ? -1 : left;
      }
      bucketed = to_max == -1;
      key.push_back(to_max);
      key.push_back(std::min<int64_t>(std::max(r.min - n.count, 0), horizon_));
      key.push_back(n.partial);
    }
    chain.push_back(n);
    at = n.parent;
  }
  const bool reaches_bottom = at < 0;
  key.push_back(reaches_bottom ? -1 : -2);
  {
    std::lock_guard lock(mutex_);
    auto it = entries_.find(key);
    if (it != entries_.end()) return it->second;
  }
  // A private copy of the chain, its last node's parent cut to the bottom.
  std::vector<StackNode> local(chain.begin(), chain.end());
  for (size_t k = 0; k < local.size(); ++k)
    local[k].parent = k + 1 < local.size() ? int32_t(k + 1) : -1;
  ParseState start;
  start.tops.push_back(0);
  const Vocabulary::SortedList& all = vocab_->all();
  // A run on top, between characters: the tokens that stay inside it are decided by their
  // character count alone (inside_table); when no path that leaves the run can take a byte that
  // starts a character of the class, those needing more characters than the run has left die.
  detail::InsideRun inside;
  std::shared_ptr<const Vocabulary::InsideTable> table;
  const bool use_inside = [&] {
    const Grammar::Element top_elem = grammar_->elements[size_t(local[0].elem)];
    if (top_elem.kind != Kind::Run || local[0].partial != 0) return false;
    const Grammar::Run& r = grammar_->runs[size_t(top_elem.arg)];
    table = vocab_->inside_table(grammar_->classes[size_t(r.cls)], bucket_, walk_threads_);
    inside.need = table->need.data();
    const int64_t left = r.max == Grammar::kUnbounded ? horizon_ : r.max - local[0].count;
    inside.limit = uint32_t(std::clamp<int64_t>(left, 0, detail::InsideRun::kOutside - 1));
    std::vector<StackNode> scratch = local;
    ParseState exit, next;
    detail::leave_run(*grammar_, scratch, 0, exit);
    inside.reject_over = !exit.complete;
    const CodePointClass& c = grammar_->classes[size_t(r.cls)];
    for (uint32_t b = 0; b < 256 && inside.reject_over; ++b) {
      const bool starts_char = b < 0x80 ? c.contains(b)
                                        : b >= 0xC2 && b <= 0xF4 &&
                                              c.intersects(b >= 0xF0   ? 0x10000
                                                           : b >= 0xE0 ? 0x800
                                                                       : 0x80,
                                                           0x10FFFF);
      if (!starts_char) continue;
      detail::advance(*grammar_, scratch, exit, uint8_t(b), next);
      if (!next.tops.empty() || next.complete) inside.reject_over = false;
    }
    return true;
  }();
  auto e = std::make_shared<Entry>();
  const size_t words = (size_t(vocab_->size()) + 31) / 32;
  // The tokens inside the run that fit what it has left; a bucketed entry leaves the long ones
  // uncertain (the count decides them).
  std::vector<uint32_t> bits(words, 0u);
  if (use_inside) {
    const auto& up_to = table->up_to;
    bits = up_to[std::min<size_t>(inside.limit, size_t(bucket_) + 1)];
    if (bucketed) {
      bits = up_to[size_t(bucket_)];
      for (size_t w = 0; w < words; ++w) bits[w] &= ~long_bits_[w];
    }
  }
  // The walk of a new context over the whole sorted vocabulary, in chunks taken by the pool's
  // threads, each with its own copy of the chain. Accepted tokens go straight into the bitset;
  // the uncertain ones (positions) per chunk, joined in chunk order to keep the byte order.
  // When every token inside the run is decided (all fit, or those that do not die), only the
  // tokens outside the class are left: a short list (3% of Qwen3's for a JSON string), walked on
  // this thread.
  const bool outside_only = use_inside && !bucketed && inside.reject_over && table->outside_listed;
  const Vocabulary::SortedList& list = outside_only ? table->outside : all;
  const size_t n = list.ids.size();
  const size_t threads = outside_only ? 1 : size_t(std::max(1, walk_threads_));
  const size_t chunks = threads == 1 ? 1 : threads * 4;
  std::vector<std::vector<uint32_t>> unc(chunks);
  // Chunks [c, c_end) as one range (one setup: the serial case walks the rest at once).
  auto walk_chunks = [&](size_t c, size_t c_end) {
    const size_t begin = n * c / chunks, end = n * c_end / chunks;
    std::vector<StackNode> own = local;
    std::vector<uint32_t>& u = unc[c];
    // A bucketed entry: every long token is uncertain, whatever this count makes of it.
    auto next_long = std::lower_bound(long_positions_.begin(), long_positions_.end(), begin);
    auto long_until = [&](size_t pos) {  // the long positions before pos, in order
      for (; bucketed && next_long != long_positions_.end() && *next_long < pos; ++next_long)
        u.push_back(*next_long);
    };
    detail::walk_positions(
        *grammar_, *vocab_, list, begin, end, own, start, !reaches_bottom,
        use_inside && !outside_only ? &inside : nullptr, [&](size_t pos, detail::Verdict v) {
          long_until(pos);
          if (bucketed && next_long != long_positions_.end() && *next_long == pos) {
            u.push_back(uint32_t(pos));
            ++next_long;
            return;
          }
          if (v == detail::Verdict::Uncertain) {
            u.push_back(uint32_t(pos));
            return;
          }
          const int32_t id = list.ids[pos];
          std::atomic_ref<uint32_t>(bits[size_t(id) / 32])
              .fetch_or(1u << (id % 32), std::memory_order_relaxed);
        });
    long_until(end);
  };
  const std::function<void(size_t)> walk_chunk = [&](size_t c) { walk_chunks(c, c + 1); };
  // This thread walks the first chunk; the rest go to the pool only when that projects the whole
  // walk past parallel_walk_ms_. Most new contexts take tens of microseconds, where waking
  // threads costs more than it saves (and a helper preempted mid-chunk would hold the step).
  const auto first_start = std::chrono::steady_clock::now();
  walk_chunk(0);
  const double first_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - first_start)
          .count();
  if (chunks > 1 && first_ms * double(chunks) >= parallel_walk_ms_) {
    const std::function<void(size_t)> rest = [&](size_t c) { walk_chunk(c + 1); };
    WalkPool::shared().run(chunks - 1, int(threads) - 1, rest);
  } else if (chunks > 1) {
    walk_chunks(1, chunks);
  }
  size_t accepted_count = 0;
  for (uint32_t w : bits) accepted_count += size_t(std::popcount(w));
  if (accepted_count > size_t(vocab_->size()) / 32) {
    e->accepted_bits = std::move(bits);
  } else {
    for (size_t w = 0; w < words; ++w)
      for (uint32_t x = bits[w]; x; x &= x - 1)
        e->accepted_ids.push_back(int32_t(w * 32 + size_t(std::countr_zero(x))));
  }
  std::vector<int32_t> uncertain;
  for (const auto& u : unc)
    for (uint32_t pos : u) uncertain.push_back(list.ids[pos]);
  e->uncertain = vocab_->sublist(uncertain);
  std::lock_guard lock(mutex_);
  if (entries_.size() >= kMaxEntries) entries_.clear();  // bounded memory: start over
  return entries_.emplace(std::move(key), std::move(e)).first->second;
}

Matcher::Matcher(std::shared_ptr<GrammarIndex> index) : index_(std::move(index)) {
  state_ = detail::initial_state(index_->grammar(), nodes_);
}

bool Matcher::accept_bytes(std::string_view bytes) {
  if (finished_) return false;
  const size_t base = nodes_.size();
  ParseState cur = state_, next;
  for (char c : bytes) {
    detail::advance(index_->grammar(), nodes_, cur, uint8_t(c), next);
    if (next.tops.empty() && !next.complete) {
      nodes_.resize(base);
      return false;
    }
    std::swap(cur, next);
  }
  state_ = std::move(cur);
  return true;
}

bool Matcher::accept_token(int32_t token) {
  const Vocabulary& v = index_->vocab();
  if (finished_ || token < 0 || token >= v.size()) return false;
  const auto& ends = v.end_tokens();
  if (std::find(ends.begin(), ends.end(), token) != ends.end()) {
    if (!state_.complete) return false;
    finished_ = true;
    return true;
  }
  const std::string& b = v.bytes(token);
  return !b.empty() && accept_bytes(b);
}

void Matcher::fill_mask(std::span<uint32_t> allowed) {
  std::fill(allowed.begin(), allowed.end(), 0u);
  const Vocabulary& v = index_->vocab();
  auto set = [&](int32_t id) {
    if (size_t(id) / 32 < allowed.size()) allowed[size_t(id) / 32] |= 1u << (id % 32);
  };
  if (finished_) return;
  if (state_.complete)
    for (int32_t id : v.end_tokens()) set(id);
  for (int32_t top : state_.tops) {
    auto e = index_->entry(nodes_, top);
    const size_t words = std::min(allowed.size(), e->accepted_bits.size());
    for (size_t w = 0; w < words; ++w) allowed[w] |= e->accepted_bits[w];
    for (int32_t id : e->accepted_ids) set(id);
    if (e->uncertain.ids.empty()) continue;
    ParseState start;
    start.tops.push_back(top);
    detail::walk(index_->grammar(), v, e->uncertain, nodes_, start, false,
                 [&](int32_t id, detail::Verdict verdict) {
                   if (verdict == detail::Verdict::Accept) set(id);
                 });
  }
}

}  // namespace lilac::grammar
