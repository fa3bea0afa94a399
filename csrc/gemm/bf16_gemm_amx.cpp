// The AMX kernel of bf16_gemm_amx.h.
//
// Tiles: every tile is 16 rows of 64 bytes. tmm0..3 accumulate a 32 x 32 block
// of out in fp32 (2 x 2 tiles of 16 x 16); per step of 32 k, tmm4/5 hold rows
// 0-15 / 16-31 of a (32 bf16 each), tmm6/7 columns 0-15 / 16-31 of b (16 rows of
// k pairs, each a 32-bit word per column: bf16 of k low, of k + 1 high), and four
// TDPBF16PS multiply them: each tile loaded is used twice.
//
// Packed layouts, one panel per 32 rows of a (32 columns of b), step-major so a
// step's two tiles are 2 KiB of consecutive memory:
//   a panel: [step][row 0..31][32 bf16]                     (tile rows, 64 bytes each)
//   b panel: [step][half 0..1][pair 0..15][column 0..15]    (32-bit words)
// zero past K and past the matrix's edge (code 0 decodes to +0).
//
// Order of work: b, the weight, is packed once per call (all threads). a is
// packed by groups of panels that fit in L2 together, each by the thread that
// uses it, right before it sweeps every b panel (or its share of them), chunk of
// K by chunk: a b chunk (32 KiB) stays in L1 while the group's a chunks stream
// from L2 past it (loaded with the T1 hint), and the next b chunk is prefetched
// from L3 into L2 meanwhile. Where K <= 256 and b fits in L2 the roles swap: an
// a panel stays in L1 while every b panel streams past it, so that the pending
// sums are two blocks, not a group's. The epilogue of the blocks of two b panels
// runs, a row of 64 columns at a time, while the tiles work on the next two;
// where out is larger than the threads' L2 caches it goes to memory with
// non-temporal stores. a never travels through memory decoded, so its memory
// stays bounded for any M.
#include "gemm/bf16_gemm_amx.h"

#if defined(__x86_64__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#if FP8MP_AVX512_KERNELS
#include <algorithm>

#include "common/avx512_lanes.h"
#include "common/fp8_decode_table.h"
#include "common/scratch_pool.h"
#include "gemm/bf16_kernel_io_avx512.h"

#define FP8MP_TARGET_AMX \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,amx-tile,amx-bf16")))
#endif

namespace fp8mp::cpu {

#if defined(__x86_64__)
namespace {

// Linux's arch_prctl codes (asm/prctl.h) and the tile data's state component (XTILEDATA).
constexpr int kArchGetXcompPerm = 0x1022, kArchReqXcompPerm = 0x1023;
constexpr unsigned kXfeatureXtiledata = 18;

bool request_tile_permission() {
  if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) != 0) return false;
  unsigned long long granted = 0;
  return syscall(SYS_arch_prctl, kArchGetXcompPerm, &granted) == 0 && ((granted >> kXfeatureXtiledata) & 1u);
}

}  // namespace

bool amx_bf16_usable() {
  static const bool usable = FP8MP_AVX512_KERNELS && cpu_features().avx512_bf16 && cpu_features().amx_bf16 &&
                             request_tile_permission();
  return usable;
}
#else
bool amx_bf16_usable() { return false; }
#endif

#if FP8MP_AVX512_KERNELS
namespace {

constexpr int kPanel = 32;                            // rows of an a panel, columns of a b panel: two tiles
constexpr int kStep = 32;                             // k per tile step: 64 bytes of bf16 per tile row
constexpr int64_t kStepWords = kPanel * kStep / 2;    // 32-bit words of one panel's step (2 KiB)
// Steps of k summed in the tiles before their sums are added to the block's (kAmxChunkK, the summation rule
// of bf16_kernel_io_avx512.h). The chunk of a b panel (32 KiB) stays in L1 while the a chunks stream past
// it because a's tiles are loaded with the T1 hint (TILELOADDT1: from L2, without displacing L1's lines).
// Measured on a Xeon with AMX, 2 threads, 4096x1024x1024 -> bf16 (mean of 100 calls): chunks of 256 with
// plain loads 3.64-3.95 ms, with a's loads hinted 3.42-3.73, chunks of 512 hinted 3.02-3.24 (plain: 3.85-4.03,
// the b chunk no longer held in L1); 8192x2048x2048: 34.0 (256, plain) -> 29.3 ms.
constexpr int64_t kChunkSteps = kAmxChunkK / kStep;
// Steps of an a panel that L1 holds beside the b panels streaming past it (16 KiB): see the K <= 256 order.
constexpr int64_t kPanelInL1Steps = 8;
// a panels per group: 8, as long as the group takes between 512 KiB and 1 MiB of L2 (of 2 MiB). Measured on
// a Xeon with AMX, 2 threads: best of 256 KiB - 2 MiB groups at K = 512, 1024 (512 KiB), 2048 and 4096 (1 MiB).
constexpr int64_t kGroupPanels = 8;
constexpr int64_t kMinGroupBytes = int64_t(1) << 19, kMaxGroupBytes = int64_t(1) << 20;

int64_t steps_of(int64_t K) { return (K + kStep - 1) / kStep; }

// The 64-byte tile configuration (palette 1): all eight tiles 16 rows of 64 bytes.
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {64, 64, 64, 64, 64, 64, 64, 64};
  uint8_t rows[16] = {16, 16, 16, 16, 16, 16, 16, 16};
};

// Tiles configured for the calling thread while in scope, released after (so that the OS need not save
// 8 KiB of tile state for a thread that no longer uses them).
struct TileScope {
  FP8MP_TARGET_AMX TileScope() {
    static const TileConfig config;
    _tile_loadconfig(&config);
  }
  FP8MP_TARGET_AMX ~TileScope() { _tile_release(); }
};

// r[i] word j -> r[j] word i for a 16 x 16 block of 32-bit words: unpacks within 128-bit lanes, then a 4 x 4
// transpose of the lanes.
FP8MP_TARGET_AMX inline void transpose16x16_words(__m512i r[16]) {
  __m512i t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  // u[4g + q], lane l: words 4g..4g+3 of the input rows' word 4l + q.
  __m512i u[16];
  for (int g = 0; g < 4; ++g) {
    u[4 * g + 0] = _mm512_unpacklo_epi64(t[4 * g], t[4 * g + 2]);
    u[4 * g + 1] = _mm512_unpackhi_epi64(t[4 * g], t[4 * g + 2]);
    u[4 * g + 2] = _mm512_unpacklo_epi64(t[4 * g + 1], t[4 * g + 3]);
    u[4 * g + 3] = _mm512_unpackhi_epi64(t[4 * g + 1], t[4 * g + 3]);
  }
  for (int q = 0; q < 4; ++q) {
    __m512i o[4];
    transpose_lanes4x4(u[q], u[4 + q], u[8 + q], u[12 + q], o);
    for (int j = 0; j < 4; ++j) r[4 * j + q] = o[j];
  }
}

// The a panel of rows [row0, row0 + 32) of codes [rows, K].
FP8MP_TARGET_AMX void pack_a_panel(const uint8_t* codes, int64_t rows, int64_t K, int64_t row0,
                                   const Bf16Decoder& decode, uint16_t* panel) {
  const int64_t steps = steps_of(K);
  for (int i = 0; i < kPanel; ++i) {
    const int64_t row = row0 + i;
    const uint8_t* src = codes + row * K;
    for (int64_t s = 0; s < steps; ++s) {
      const int64_t count = row < rows ? std::min<int64_t>(kStep, K - s * kStep) : 0;
      _mm512_store_si512(panel + (s * kPanel + i) * kStep, decode(load_codes(src + s * kStep, count)));
    }
  }
}

// The b panel of rows [col0, col0 + 32) of codes [cols, K] (columns of the product): 16 rows' 32 codes
// decoded into 16 registers of 16 pairs each, transposed to 16 pairs of 16 columns each.
FP8MP_TARGET_AMX void pack_b_panel(const uint8_t* codes, int64_t cols, int64_t K, int64_t col0,
                                   const Bf16Decoder& decode, uint32_t* panel) {
  const int64_t steps = steps_of(K);
  for (int64_t s = 0; s < steps; ++s) {
    for (int h = 0; h < 2; ++h) {
      __m512i r[16];
      for (int c = 0; c < 16; ++c) {
        const int64_t col = col0 + 16 * h + c;
        const int64_t count = col < cols ? std::min<int64_t>(kStep, K - s * kStep) : 0;
        r[c] = decode(load_codes(codes + col * K + s * kStep, count));
      }
      transpose16x16_words(r);
      uint32_t* tile = panel + s * kStepWords + h * 256;
      for (int p = 0; p < 16; ++p) _mm512_store_si512(tile + p * 16, r[p]);
    }
  }
}

// pack(t) for the panels t in [0, count), in parallel: about 64 Ki codes per task, but a share for every
// thread where that gives each fewer panels than that.
template <typename Pack>
void pack_in_parallel(int64_t count, int64_t K, int threads, const Pack& pack, ParallelFor parallel_for) {
  const int64_t by_size = std::max<int64_t>(1, (int64_t(1) << 16) / (kPanel * std::max<int64_t>(K, 1)));
  const int64_t workers = std::max(threads, 1);
  const int64_t grain = std::min(by_size, (count + workers - 1) / workers);
  parallel_for(0, count, grain, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) pack(t);
  });
}

// b panels whose blocks go through one epilogue: a row of out is then written 64 columns at a time (128 bytes of
// bf16) rather than 32. Measured on a Xeon with AMX writing 2 MiB of bf16 that is not in cache: 64-byte runs
// a row at 30 GB/s, 128-byte runs 44 GB/s, whole rows 50 GB/s; in the kernel the stores of 64-byte runs were a
// third of the time of a 1024 x 256 x 1024 GEMM.
constexpr int kEpiloguePanels = 2;

// The 32 x 32 blocks of a group's sums against (up to) kEpiloguePanels b panels, waiting for their epilogue
// (gemm_cpu_kernels.cpp's: out = scalar_t(acc * scale + bias)), done a row at a time while the tiles work on
// the next b panels, so that the AVX-512 work and the stores to out overlap the tile multiplications instead
// of leaving the tiles idle (measured: an epilogue after each block cost a quarter of the kernel's time).
template <typename scalar_t>
struct PendingEpilogue {
  const float* acc[kEpiloguePanels] = {};  // per b panel: rows of 32 sums, the group's blocks one after another
  const scalar_t* bias = nullptr;
  scalar_t* out = nullptr;     // row 0, column 0 of the first block
  int64_t ldo = 0;
  int cols = 0;                // columns, at most 32 * kEpiloguePanels
  int64_t next = 0, end = 0;   // the rows left: [next, end)
  float scale = 1.0f;
  bool streaming = false;      // full rows of 32 at 64-byte aligned addresses go through stream_row32
  __m512 bias_v[2 * kEpiloguePanels];  // bias as fp32, 16 columns each (zeros past cols)

  FP8MP_TARGET_AMX void start(float* const* sums, const scalar_t* block_bias, scalar_t* block_out, int64_t rows,
                              int block_cols) {
    for (int p = 0; p < kEpiloguePanels; ++p) acc[p] = sums[p];
    bias = block_bias;
    out = block_out;
    cols = block_cols;
    next = 0;
    end = rows;
    for (int h = 0; h < 2 * kEpiloguePanels; ++h) {
      const int count = std::min(16, cols - 16 * h);
      bias_v[h] = bias != nullptr && count > 0 ? load_bias(bias + 16 * h, count) : _mm512_setzero_ps();
    }
  }

  // The next `count` rows (or what is left).
  FP8MP_TARGET_AMX void store(int64_t count) {
    const __m512 vscale = _mm512_set1_ps(scale);
    for (; count > 0 && next < end; --count, ++next) {
      for (int p = 0; p < kEpiloguePanels && 32 * p < cols; ++p) {
        __m512 v0 = _mm512_mul_ps(_mm512_load_ps(acc[p] + next * kPanel), vscale);
        __m512 v1 = _mm512_mul_ps(_mm512_load_ps(acc[p] + next * kPanel + 16), vscale);
        if (bias != nullptr) {
          v0 = _mm512_add_ps(v0, bias_v[2 * p]);
          v1 = _mm512_add_ps(v1, bias_v[2 * p + 1]);
        }
        scalar_t* const row = out + next * ldo + 32 * p;
        if (streaming && cols - 32 * p >= 32 && reinterpret_cast<uintptr_t>(row) % 64 == 0) {
          stream_row32(v0, v1, row);
        } else {
          store_row32(v0, v1, row, std::min(32, cols - 32 * p));
        }
      }
    }
  }

  FP8MP_TARGET_AMX void finish() { store(end - next); }
};

// The four accumulator tiles into the 32 x 32 block at dst (row-major fp32).
FP8MP_TARGET_AMX inline void store_tiles(float* dst) {
  _tile_stored(0, dst, 128);
  _tile_stored(1, dst + 16, 128);
  _tile_stored(2, dst + 16 * 32, 128);
  _tile_stored(3, dst + 16 * 32 + 16, 128);
}

// One chunk of an a panel x b panel: the tiles sum `steps` steps from zero, and the sums go to acc (the
// first chunk) or are added to it (add_chunk_sums); `epilogue_rows` rows of the pending epilogue are stored
// per step. kStreamA: a's tiles are loaded with the T1 hint (a streams from L2 past b, which stays in L1),
// else b's (the other way round).
template <bool kStreamA, typename scalar_t>
FP8MP_TARGET_AMX void multiply_chunk(const uint16_t* a, const uint32_t* b, int64_t steps, bool first, float* acc,
                                     float* compensation, float* chunk_sums, PendingEpilogue<scalar_t>& pending,
                                     int64_t epilogue_rows, const char* prefetch, int64_t prefetch_lines) {
  // compensation == nullptr: plain sums of the chunks' sums.
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t s = 0; s < steps; ++s, a += kStepWords * 2, b += kStepWords) {
    // (GCC's tile intrinsics paste the tile number into their assembly: it cannot be a template argument.)
    if constexpr (kStreamA) {
      _tile_stream_loadd(4, a, 64);
      _tile_loadd(6, b, 64);
    } else {
      _tile_loadd(4, a, 64);
      _tile_stream_loadd(6, b, 64);
    }
    _tile_dpbf16ps(0, 4, 6);
    if constexpr (kStreamA) {
      _tile_loadd(7, b + 256, 64);
    } else {
      _tile_stream_loadd(7, b + 256, 64);
    }
    _tile_dpbf16ps(1, 4, 7);
    if constexpr (kStreamA) {
      _tile_stream_loadd(5, a + 512, 64);
    } else {
      _tile_loadd(5, a + 512, 64);
    }
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
    pending.store(epilogue_rows);
    for (int64_t l = 0; l < prefetch_lines; ++l, prefetch += 64) _mm_prefetch(prefetch, _MM_HINT_T1);
  }
  if (first) {
    store_tiles(acc);
    if (compensation != nullptr) {
      for (int i = 0; i < kPanel * kPanel; i += 16) _mm512_store_ps(compensation + i, _mm512_setzero_ps());
    }
    return;
  }
  store_tiles(chunk_sums);
  for (int i = 0; i < kPanel * kPanel; i += 16) {
    add_chunk_sums(acc + i, compensation != nullptr ? compensation + i : nullptr, _mm512_load_ps(chunk_sums + i),
                   false);
  }
}

}  // namespace

template <typename scalar_t>
void fp8_gemm_amx_bf16(const uint8_t* a, Fp8Format a_format, const uint8_t* b, Fp8Format b_format, int64_t M,
                       int64_t N, int64_t K, float scale, const scalar_t* bias, scalar_t* out,
                       ParallelFor parallel_for, int threads) {
  const int64_t steps = steps_of(K), panel_words = steps * kStepWords;
  const int64_t col_panels = (N + kPanel - 1) / kPanel, row_panels = (M + kPanel - 1) / kPanel;
  const ScratchBuffer b_storage(size_t(col_panels * panel_words) * 4);
  uint32_t* const b_packed = b_storage.as<uint32_t>();
  const Bf16Decoder b_decode(bf16_decode_table_for(b_format)), a_decode(bf16_decode_table_for(a_format));
  pack_in_parallel(col_panels, K, threads, [&](int64_t t) {
    pack_b_panel(b, N, K, t * kPanel, b_decode, b_packed + t * panel_words);
  }, parallel_for);

  // Groups of a panels that fit in L2 together, as many as threads at least (a multiple of them where
  // there are more); where there are fewer groups than threads, threads split a group's b panels.
  const int64_t threads64 = std::max(1, threads);
  const int64_t panel_bytes = panel_words * 4;
  const int64_t group_bytes = std::clamp(kGroupPanels * panel_bytes, kMinGroupBytes, kMaxGroupBytes);
  const int64_t group_by_l2 = std::max<int64_t>(1, group_bytes / panel_bytes);
  int64_t groups = (row_panels + group_by_l2 - 1) / group_by_l2;
  groups = std::min(row_panels, (groups + threads64 - 1) / threads64 * threads64);
  // A small a (within kMinGroupBytes) against a b at least twice as wide: one group, which every thread packs,
  // and a share of b's panels each, rather than a share of a each and all of b (half of it packed into the
  // other thread's L2). Measured on a Xeon with AMX, 2 threads, kernel alone (best of 200-300): 256x1024x1024
  // 0.28-0.31 -> 0.23-0.26 ms, 128x1024x1024 0.22-0.23 -> 0.15, 64x4096x4096 2.9-3.1 -> 2.3, 128x512x4096
  // 0.44 -> 0.31, 512x512x1024 unchanged; where b is not wider, twice a's packing costs more than it saves
  // (1024x256x1024 0.21-0.23 -> 0.22-0.24 ms, 512x512x512 0.11 -> 0.13).
  if (threads64 > 1 && row_panels * panel_bytes <= kMinGroupBytes && N >= 2 * M && col_panels >= threads64) {
    groups = 1;
  }
  const int64_t group = (row_panels + groups - 1) / groups;
  groups = (row_panels + group - 1) / group;
  const int64_t col_splits = std::min(col_panels, (threads64 + groups - 1) / groups);
  const int64_t chunks = (steps + kChunkSteps - 1) / kChunkSteps;
  const bool compensated = compensates(K);
  // Rows of the pending epilogue to store per step so that it ends with the next b panels' work.
  const int64_t epilogue_rows = (kPanel + kEpiloguePanels * steps - 1) / (kEpiloguePanels * steps);
  parallel_for(0, groups * col_splits, 1, [&](int64_t begin, int64_t end) {
    const int64_t block = kPanel * kPanel;
    // This thread's group of a panels, decoded; its sums against 2 x kEpiloguePanels b panels (those in the
    // tiles and those in the epilogue); the compensation of the one in the tiles; one chunk's sums.
    constexpr int kSums = 2 * kEpiloguePanels;
    const ScratchBuffer a_storage(size_t(group * panel_words) * 4 + size_t((kSums + 1) * group + 1) * block * 4);
    uint16_t* const a_packed = a_storage.as<uint16_t>();
    float* sums[kSums];
    for (int i = 0; i < kSums; ++i) sums[i] = a_storage.as<float>() + group * panel_words + i * group * block;
    float* const compensation = sums[kSums - 1] + group * block;
    float* const chunk_sums = compensation + group * block;
    const TileScope tiles;
    PendingEpilogue<scalar_t> pending;
    pending.scale = scale;
    pending.ldo = N;
    // Non-temporal stores where out outlives the caches (cpu_features.h). Measured on a Xeon with AMX, 2
    // threads, 2 MiB L2 each: fp8mp.nn.Linear fwd+bwd 4096x1024x1024 (outputs 8-16 MiB) 24.5-25.6 ->
    // 19.2-21.9 ms with fp32 input, 21.5-22.8 -> 19.1-21.0 ms with bf16.
    pending.streaming = larger_than_l2_caches(M * N * int64_t(sizeof(scalar_t)), threads);
    int64_t packed_group = -1, epilogues = 0;
    // Once the blocks of rows [row0, row0 + rows) against the b panels up to cp (the last of its epilogue
    // group, at index in_epilogue in it) are summed: the previous epilogue finished, theirs pending.
    const auto start_epilogue = [&](float* const* block_sums, int64_t row0, int64_t rows, int64_t cp,
                                    int64_t in_epilogue) FP8MP_TARGET_AMX {
      const int64_t col0 = (cp - in_epilogue) * kPanel;
      pending.finish();
      pending.start(block_sums, bias != nullptr ? bias + col0 : nullptr, out + row0 * N + col0, rows,
                    int(std::min((cp + 1) * kPanel, N) - col0));
      ++epilogues;
    };
    for (int64_t t = begin; t < end; ++t) {
      const int64_t g = t / col_splits, split = t % col_splits;
      const int64_t panel0 = g * group, in_group = std::min(group, row_panels - panel0);
      if (g != packed_group) {
        for (int64_t i = 0; i < in_group; ++i) {
          pack_a_panel(a, M, K, (panel0 + i) * kPanel, a_decode, a_packed + i * panel_words * 2);
        }
        packed_group = g;
      }
      const int64_t cp_begin = split * col_panels / col_splits, cp_end = (split + 1) * col_panels / col_splits;
      if (steps <= kPanelInL1Steps && (cp_end - cp_begin) * panel_bytes <= kMaxGroupBytes) {
        // K <= 256 and this split's b panels fit in L2: an a panel at a time against each b panel, the a
        // panel (16 KiB at most) held in L1 while the b panels stream past it from L2 (the T1 hint on b's
        // tiles), so that the pending epilogue covers 32 rows of two blocks, whose 8 KiB of sums stay in L1
        // rather than a group's going through L2. Measured on a Xeon with AMX, 1 thread, 1024x256x256 ->
        // bf16, mean: 134-137 us storing the tiles to a group's sums, 117-120 storing them to 4 KiB in L1,
        // 107-114 not storing them (results wrong); this order 133-137 -> 120-126 us, 2 threads 103-130 ->
        // 87-92 us, 1024x256x1024 275-291 -> 246-266 us. Not at K = 512 (1024x512x1024: 426-450 -> 461-463
        // us) nor where b outgrows L2 (256x256x8192: 862-892 -> 1040-1067 us, b read from L3 once per a panel
        // instead of once per group).
        for (int64_t i = 0; i < in_group; ++i) {
          const int64_t row0 = (panel0 + i) * kPanel;
          for (int64_t cp = cp_begin; cp < cp_end; ++cp) {
            const int64_t in_epilogue = (cp - cp_begin) % kEpiloguePanels;
            float* const* const block_sums = sums + (epilogues & 1) * kEpiloguePanels;
            multiply_chunk<false>(a_packed + i * panel_words * 2, b_packed + cp * panel_words, steps, true,
                                  block_sums[in_epilogue], nullptr, chunk_sums, pending, epilogue_rows, nullptr, 0);
            if (in_epilogue + 1 < kEpiloguePanels && cp + 1 < cp_end) continue;
            start_epilogue(block_sums, row0, std::min<int64_t>(kPanel, M - row0), cp, in_epilogue);
          }
        }
        continue;
      }
      // Each b panel of this split against the group's a panels: chunk by chunk, the chunk of the b panel
      // (32 KiB) stays in L1 while the group's chunks of a stream from L2.
      for (int64_t cp = cp_begin; cp < cp_end; ++cp) {
        const int64_t in_epilogue = (cp - cp_begin) % kEpiloguePanels;
        float* const* const block_sums = sums + (epilogues & 1) * kEpiloguePanels;
        float* const acc = block_sums[in_epilogue];
        for (int64_t c = 0; c < chunks; ++c) {
          const int64_t s0 = c * kChunkSteps, chunk_steps = std::min(kChunkSteps, steps - s0);
          // The b chunk after this one, brought into L2 meanwhile, a share of its lines per step (measured:
          // 10-15 % faster at K >= 2048, where the hardware's prefetch left the tiles waiting on L3). Past the
          // last panel's end it prefetches nothing useful but harmless: a prefetch never faults.
          const uint32_t* next_b = c + 1 < chunks ? b_packed + cp * panel_words + (s0 + kChunkSteps) * kStepWords
                                                  : b_packed + std::min(cp + 1, col_panels - 1) * panel_words;
          const int64_t lines = kChunkSteps * kStepWords * 4 / 64;
          const int64_t per_step = (lines + in_group * chunk_steps - 1) / (in_group * chunk_steps);
          for (int64_t i = 0; i < in_group; ++i) {
            const int64_t first_line = std::min(lines, i * chunk_steps * per_step);
            multiply_chunk<true>(a_packed + i * panel_words * 2 + s0 * kStepWords * 2,
                                 b_packed + cp * panel_words + s0 * kStepWords, chunk_steps, c == 0, acc + i * block,
                                 compensated ? compensation + i * block : nullptr, chunk_sums, pending,
                                 epilogue_rows, reinterpret_cast<const char*>(next_b) + first_line * 64,
                                 std::min(per_step, (lines - first_line + chunk_steps - 1) / chunk_steps));
          }
        }
        if (in_epilogue + 1 < kEpiloguePanels && cp + 1 < cp_end) continue;
        const int64_t row0 = panel0 * kPanel;
        start_epilogue(block_sums, row0, std::min(in_group * kPanel, M - row0), cp, in_epilogue);
      }
    }
    pending.finish();
    if (pending.streaming) _mm_sfence();  // non-temporal stores are weakly ordered: fenced before the task ends
  });
}

template void fp8_gemm_amx_bf16<float>(const uint8_t*, Fp8Format, const uint8_t*, Fp8Format, int64_t, int64_t,
                                       int64_t, float, const float*, float*, ParallelFor, int);
template void fp8_gemm_amx_bf16<bf16>(const uint8_t*, Fp8Format, const uint8_t*, Fp8Format, int64_t, int64_t,
                                      int64_t, float, const bf16*, bf16*, ParallelFor, int);
template void fp8_gemm_amx_bf16<fp16>(const uint8_t*, Fp8Format, const uint8_t*, Fp8Format, int64_t, int64_t,
                                      int64_t, float, const fp16*, fp16*, ParallelFor, int);
#endif

}  // namespace fp8mp::cpu
