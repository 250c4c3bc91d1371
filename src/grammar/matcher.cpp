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

void walk(const Grammar& g, const Vocabulary& v, const Vocabulary::SortedList& list, Nodes& nodes,
          const ParseState& start, bool bottom_is_context,
          const std::function<void(int32_t, Verdict)>& on) {
  walk_range(g, v, list, 0, list.ids.size(), nodes, start, bottom_is_context, on);
}

void walk_range(const Grammar& g, const Vocabulary& v, const Vocabulary::SortedList& list,
                size_t begin, size_t end, Nodes& nodes, const ParseState& start,
                bool bottom_is_context, const std::function<void(int32_t, Verdict)>& on) {
  const size_t base = nodes.size();
  const size_t depth_max = v.max_token_bytes() + 1;
  // Per depth k (bytes consumed of the current token): the state, the node count before it was
  // computed, and whether a stack ran off the bottom at some depth <= k.
  std::vector<ParseState> hist(depth_max + 1);
  std::vector<size_t> mark(depth_max + 1, base);
  std::vector<char> bottom(depth_max + 1, 0);
  hist[0] = start;
  bottom[0] = start.complete;
  size_t levels = 1;  // the first token of the range starts from the root
  const size_t n = std::min(end, list.ids.size());
  for (size_t i = begin; i < n; ++i) {
    const int32_t id = list.ids[i];
    const std::string_view s = list.bytes(i);
    const size_t d = std::min<size_t>(list.lcp[i], levels - 1);
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
      on(id, Verdict::Accept);
      continue;
    }
    // Dead after k bytes: so is every following token that shares those k bytes.
    nodes.resize(mark[k]);
    const Verdict verdict =
        bottom_is_context && bottom[k - 1] ? Verdict::Uncertain : Verdict::Reject;
    if (verdict != Verdict::Reject) on(id, verdict);
    while (i + 1 < n && list.lcp[i + 1] >= k) {
      ++i;
      if (verdict != Verdict::Reject) on(list.ids[i], verdict);
    }
  }
  nodes.resize(base);
}

}  // namespace detail

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
  auto e = std::make_shared<Entry>();
  std::vector<int32_t> uncertain;
  std::vector<int32_t>& accepted = e->accepted_ids;
  // The walk of a new context: the whole vocabulary (~10 ms for 150k tokens on one core), split
  // into contiguous ranges of the sorted list, one per thread, each with its own copy of the
  // chain; concatenated in range order, the results keep the byte order.
  {
    const Vocabulary::SortedList& all = vocab_->all();
    const size_t n = all.ids.size(), parts = size_t(std::max(1, walk_threads_));
    std::vector<std::vector<int32_t>> acc(parts), unc(parts);
    auto walk_part = [&](size_t p) {
      std::vector<StackNode> own = local;
      detail::walk_range(*grammar_, *vocab_, all, n * p / parts, n * (p + 1) / parts, own, start,
                         !reaches_bottom, [&](int32_t id, detail::Verdict v) {
                           (v == detail::Verdict::Accept ? acc[p] : unc[p]).push_back(id);
                         });
    };
    std::vector<std::thread> helpers;
    for (size_t p = 1; p < parts; ++p) helpers.emplace_back(walk_part, p);
    walk_part(0);
    for (auto& t : helpers) t.join();
    for (size_t p = 0; p < parts; ++p) {
      accepted.insert(accepted.end(), acc[p].begin(), acc[p].end());
      uncertain.insert(uncertain.end(), unc[p].begin(), unc[p].end());
    }
  }
  if (bucketed) {
    const auto is_long = [&](int32_t id) { return vocab_->bytes(id).size() > size_t(bucket_); };
    std::erase_if(accepted, is_long);
    std::vector<uint8_t> mark(size_t(vocab_->size()), 0);
    for (int32_t id : uncertain) mark[size_t(id)] = 1;
    uncertain.clear();
    for (int32_t id : vocab_->all().ids)  // in byte order, as sublist wants
      if (mark[size_t(id)] || is_long(id)) uncertain.push_back(id);
  }
  if (accepted.size() > size_t(vocab_->size()) / 32) {
    e->accepted_bits.assign((size_t(vocab_->size()) + 31) / 32, 0u);
    for (int32_t id : accepted) e->accepted_bits[size_t(id) / 32] |= 1u << (id % 32);
    accepted.clear();
    accepted.shrink_to_fit();
  }
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
