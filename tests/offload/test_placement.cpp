// Placement::slot_classes: slots sized per unit kind cover every unit set the schedule holds at
// once (a window of consecutive units, plus unit 0 when kept), never hold more elements than the
// old pool of window (+ 1) slots of the largest unit, and split where they should: a model whose
// blocks are its largest units keeps one class; a large vocabulary gives the embedding and the
// head one shared slot and the blocks slots of their own size. Placement::aliased_grads: which
// placements have no gradient slots at all.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "offload/placement.h"

using namespace strata;

namespace {

constexpr int kEmb = 0, kBlock = 1, kHead = 2;

// Embedding, n blocks, head.
std::vector<int> kinds_of(int blocks) {
  std::vector<int> k{kEmb};
  k.insert(k.end(), size_t(blocks), kBlock);
  k.push_back(kHead);
  return k;
}

std::vector<uint64_t> numel_of(const std::vector<int>& kinds, uint64_t emb, uint64_t block, uint64_t head) {
  std::vector<uint64_t> n;
  for (int k : kinds) n.push_back(k == kEmb ? emb : k == kBlock ? block : head);
  return n;
}

// Every held set fits: for each window (and unit 0 when kept), each class has a slot for each
// of its units held, and each slot is big enough for the units of its class.
void expect_covers(const std::vector<SlotClass>& classes, const std::vector<int>& kinds,
                   const std::vector<uint64_t>& numel, int window, bool keep) {
  const int units = int(kinds.size());
  const int w = std::min(window, units);
  for (int u = 0; u < units; ++u) {
    int served = 0;
    for (const auto& c : classes)
      if (c.kinds >> kinds[size_t(u)] & 1u) {
        ++served;
        EXPECT_GE(c.numel, numel[size_t(u)]) << "unit " << u;
      }
    EXPECT_EQ(served, 1) << "unit " << u << " must belong to exactly one class";
  }
  for (int s = 0; s + w <= units; ++s)
    for (const auto& c : classes) {
      int n = 0;
      for (int u = 0; u < units; ++u) {
        const bool held = (u >= s && u < s + w) || (keep && u == 0);
        n += held && (c.kinds >> kinds[size_t(u)] & 1u);
      }
      EXPECT_LE(n, c.slots) << "window at " << s << " of " << w;
    }
}

uint64_t uniform_numel(const std::vector<uint64_t>& numel, int window, bool keep) {
  const uint64_t largest = *std::max_element(numel.begin(), numel.end());
  return uint64_t(std::min<int>(window + (keep ? 1 : 0), int(numel.size()))) * largest;
}

}  // namespace

TEST(SlotClasses, BlocksLargestKeepOnePool) {
  const auto kinds = kinds_of(4);
  const auto numel = numel_of(kinds, 65536, 786432, 67584);  // the default model
  const auto classes = Placement::slot_classes(kinds, numel, 2, false);
  ASSERT_EQ(classes.size(), 1u);
  EXPECT_EQ(classes[0].slots, 2);
  EXPECT_EQ(classes[0].numel, 786432u);
  EXPECT_EQ(classes[0].kinds, 7u);
}

TEST(SlotClasses, LargeVocabularySharesOneSlotForEmbeddingAndHead) {
  const auto kinds = kinds_of(4);
  const auto numel = numel_of(kinds, 8192000, 786432, 8194048);  // vocab 32000 x dim 256
  const auto classes = Placement::slot_classes(kinds, numel, 2, false);
  ASSERT_EQ(classes.size(), 2u);
  EXPECT_EQ(Placement::slot_numel(classes), 8194048u + 2 * 786432u);
  expect_covers(classes, kinds, numel, 2, false);
  // A window that spans the whole model holds embedding and head together: a slot for each.
  const auto span = Placement::slot_classes(kinds, numel, 6, false);
  expect_covers(span, kinds, numel, 6, false);
  EXPECT_EQ(Placement::slot_numel(span), 8192000u + 8194048u + 4 * 786432u);
}

TEST(SlotClasses, TiedEmbeddingKeepsItsOwnSlot) {
  const auto kinds = kinds_of(4);
  const auto numel = numel_of(kinds, 32833536, 786432, 2048);  // vocab 128256, tied: head = norm
  const auto classes = Placement::slot_classes(kinds, numel, 2, true);
  expect_covers(classes, kinds, numel, 2, true);
  EXPECT_EQ(Placement::slot_numel(classes), 32833536u + 2 * 786432u);
}

// Random models, windows and tying: always covered, never above the old pool.
TEST(SlotClasses, RandomModelsAreCoveredAndNeverLarger) {
  std::mt19937 rng(14);
  for (int trial = 0; trial < 2000; ++trial) {
    const auto kinds = kinds_of(int(rng() % 6));
    auto size = [&] { return uint64_t(1 + rng() % 64) * 2048; };
    const uint64_t block = size();
    const auto numel = numel_of(kinds, size(), block, size());
    const int window = 1 + int(rng() % 5);
    const bool keep = rng() % 2;
    const auto classes = Placement::slot_classes(kinds, numel, window, keep);
    SCOPED_TRACE(testing::Message() << "trial " << trial << ": " << kinds.size() << " units, window "
                                    << window << (keep ? ", kept" : ""));
    expect_covers(classes, kinds, numel, window, keep);
    EXPECT_LE(Placement::slot_numel(classes), uniform_numel(numel, window, keep));
    if (HasFailure()) return;
  }
}

// The backward accumulates into the gradient shard itself (no slot) only with one rank and one
// micro-batch, and only where the shard lies in the memory the device computes in.
TEST(Placement, GradientsAliasTheShardOnlyInMemoryTheDeviceComputesIn) {
  Placement p;
  p.optimizer = Tier::host;  // gradients in host memory whatever offload.grads says
  p.grads = Tier::device;
  EXPECT_EQ(p.grads_tier(), Tier::host);
  EXPECT_FALSE(p.aliased_grads(1, false));  // a GPU copies each gradient to the host
  EXPECT_TRUE(p.aliased_grads(1, true));    // the CPU device's memory is the host's
  EXPECT_FALSE(p.aliased_grads(2, true));   // a reduce-scatter writes the shard
  p.grad_accum = 2;                         // each micro-batch is summed in a zeroed slot first
  EXPECT_FALSE(p.aliased_grads(1, true));
  p = Placement{};
  p.optimizer = Tier::device;
  p.grads = Tier::device;
  EXPECT_TRUE(p.aliased_grads(1, false));
  EXPECT_TRUE(p.aliased_grads(1, true));
  EXPECT_FALSE(p.aliased_grads(4, false));
}
