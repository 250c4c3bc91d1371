#include "tokenizer/bpe.h"

#include <algorithm>
#include <bit>

namespace lilac::tok {
namespace {

inline size_t slot_of(uint64_t key, int shift) {
  return size_t((key * 0x9E3779B97F4A7C15ULL) >> shift);
}

struct Symbol {
  int32_t id;  // -1 once merged into its left neighbour
  int32_t prev, next;
};

struct Candidate {
  uint32_t rank;
  int32_t pos;  // index of the left symbol
  int32_t merged;
};

// std heap functions keep the "largest" on top: order so that the smallest (rank, pos) is there.
struct Later {
  bool operator()(const Candidate& x, const Candidate& y) const {
    return x.rank != y.rank ? x.rank > y.rank : x.pos > y.pos;
  }
};

}  // namespace

void Bpe::add_merge(int32_t a, int32_t b, int32_t merged, uint32_t rank) {
  pending_.push_back({key(a, b), rank, merged});
}

void Bpe::finish() {
  size_t size = std::bit_ceil(std::max<size_t>(16, pending_.size() * 2));
  shift_ = 64 - std::countr_zero(size);
  table_.assign(size, Entry{kEmpty, 0, 0});
  count_ = 0;
  for (const Entry& e : pending_) {
    size_t s = slot_of(e.key, shift_);
    while (table_[s].key != kEmpty && table_[s].key != e.key) s = (s + 1) & (size - 1);
    if (table_[s].key == kEmpty) ++count_;
    table_[s] = e;
  }
  pending_.clear();
  pending_.shrink_to_fit();
}

const Bpe::Entry* Bpe::find(int32_t a, int32_t b) const {
  uint64_t k = key(a, b);
  size_t mask = table_.size() - 1;
  for (size_t s = slot_of(k, shift_);; s = (s + 1) & mask) {
    const Entry& e = table_[s];
    if (e.key == k) return &e;
    if (e.key == kEmpty) return nullptr;
  }
}

void Bpe::encode_word(std::string_view bytes, std::vector<int32_t>& out) const {
  thread_local std::vector<Symbol> syms;
  thread_local std::vector<Candidate> heap;
  syms.clear();
  heap.clear();
  for (char c : bytes) {
    int32_t id = byte_ids_[uint8_t(c)];
    if (id < 0) continue;
    int32_t i = int32_t(syms.size());
    syms.push_back({id, i - 1, i + 1});
  }
  if (syms.empty()) return;
  syms.back().next = -1;
  if (syms.size() == 1 || table_.empty()) {
    for (const Symbol& s : syms) out.push_back(s.id);
    return;
  }
  for (size_t i = 0; i + 1 < syms.size(); ++i) {
    if (const Entry* e = find(syms[i].id, syms[i + 1].id))
      heap.push_back({e->rank, int32_t(i), e->merged});
  }
  std::make_heap(heap.begin(), heap.end(), Later{});
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), Later{});
    Candidate top = heap.back();
    heap.pop_back();
    Symbol& left = syms[top.pos];
    if (left.id < 0 || left.next < 0) continue;
    Symbol& right = syms[left.next];
    // Stale: the pair at this position changed since the candidate was queued.
    const Entry* now = find(left.id, right.id);
    if (!now || now->merged != top.merged) continue;
    left.id = top.merged;
    right.id = -1;
    left.next = right.next;
    if (left.next >= 0) syms[left.next].prev = top.pos;
    if (left.prev >= 0) {
      if (const Entry* e = find(syms[left.prev].id, left.id)) {
        heap.push_back({e->rank, left.prev, e->merged});
        std::push_heap(heap.begin(), heap.end(), Later{});
      }
    }
    if (left.next >= 0) {
      if (const Entry* e = find(left.id, syms[left.next].id)) {
        heap.push_back({e->rank, top.pos, e->merged});
        std::push_heap(heap.begin(), heap.end(), Later{});
      }
    }
  }
  for (const Symbol& s : syms)
    if (s.id >= 0) out.push_back(s.id);
}

}  // namespace lilac::tok
