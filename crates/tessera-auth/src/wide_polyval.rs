//! POLYVAL (RFC 8452) sixteen blocks at a time with AVX-512 carry-less multiplication
//! (VPCLMULQDQ), for the datagram MAC.
//!
//! Why: RustCrypto's `polyval` multiplies one 128-bit block per CLMUL (four blocks per
//! reduction), and the datagram MAC is most of what the datagram transport costs over TCP
//! per payload byte. With VPCLMULQDQ one instruction multiplies four blocks, and sixteen
//! blocks share one reduction. The arithmetic is the `polyval` crate's "R/F" form (its x86
//! backend, after "Efficient GHASH Implementation Using CLMUL", eprint 2025/2171), widened:
//! block `j` of a group of sixteen is multiplied by `H^(16-j)`, the unreduced products are
//! added (XOR, linear in the block) and reduced once. Used only where the CPU has AVX-512F
//! and VPCLMULQDQ ([`WidePolyval::new`] returns `None` elsewhere, and the caller keeps the
//! `polyval` crate); the tests check it against that crate on random inputs of every length.
//!
//! All `unsafe` here is the use of CPU intrinsics, each function enabling the features it
//! needs; [`WidePolyval`] exists only once the features were detected at run time.

#[cfg(target_arch = "x86_64")]
use core::arch::x86_64::*;

/// POLYVAL's reduction constant, x^63 + x^62 + x^57.
const P1: u64 = 0xC200000000000000;

/// How many blocks one wide step hashes.
const GROUP_BLOCKS: usize = 16;

/// A POLYVAL key expanded into the powers `H^1 ..= H^16` (and their R/F companions), laid
/// out as the four 512-bit operands of a sixteen-block step.
#[derive(Clone)]
pub(crate) struct WidePolyval {
    /// `h[k]`: lanes 0..4 hold `H^(16-4k)`, `H^(15-4k)`, `H^(14-4k)`, `H^(13-4k)`.
    h: [[u8; 64]; 4],
    /// The R/F companions of `h` (`D = swap(H) + H0 * P1`).
    d: [[u8; 64]; 4],
}

impl WidePolyval {
    /// The expanded key for hash key `h`, or `None` if this CPU lacks the instructions.
    pub(crate) fn new(h: &[u8; 16]) -> Option<WidePolyval> {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("vpclmulqdq")
                && std::arch::is_x86_feature_detected!("pclmulqdq")
            {
                // SAFETY: the features `expand` enables were detected just above.
                return Some(unsafe { expand(h) });
            }
        }
        let _ = h;
        None
    }

    /// POLYVAL of `segments`, each zero-padded to whole blocks, one after the other.
    pub(crate) fn hash(&self, segments: &[&[u8]]) -> [u8; 16] {
        #[cfg(target_arch = "x86_64")]
        {
            // SAFETY: a `WidePolyval` is only made once the features were detected.
            unsafe { hash_segments(self, segments) }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = segments;
            unreachable!("WidePolyval::new returns None off x86_64")
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,vpclmulqdq,pclmulqdq,avx")]
fn expand(h: &[u8; 16]) -> WidePolyval {
    let h1 = load(h);
    let d1 = companion(h1);
    // powers[p] = H^(p+1)
    let mut powers = [h1; GROUP_BLOCKS];
    for p in 1..GROUP_BLOCKS {
        powers[p] = mul(powers[p - 1], h1, d1);
    }
    let mut wide = WidePolyval {
        h: [[0; 64]; 4],
        d: [[0; 64]; 4],
    };
    for k in 0..4 {
        for lane in 0..4 {
            let power = powers[GROUP_BLOCKS - 1 - (4 * k + lane)];
            wide.h[k][16 * lane..16 * lane + 16].copy_from_slice(&store(power));
            wide.d[k][16 * lane..16 * lane + 16].copy_from_slice(&store(companion(power)));
        }
    }
    wide
}

/// Whole groups are hashed where they lie; the blocks after them (each segment's remainder,
/// padded) are staged sixteen at a time, and the last few are hashed in one more group step
/// with the powers they need (placed at the group's end, zero blocks before them): a
/// datagram's tail of up to fifteen blocks, its header and its lengths cost one step, not a
/// chain of dependent one-block multiplications.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,vpclmulqdq,pclmulqdq,avx")]
fn hash_segments(key: &WidePolyval, segments: &[&[u8]]) -> [u8; 16] {
    let mut acc = _mm_setzero_si128();
    let mut staged = [0u8; GROUP_BLOCKS * 16];
    let mut count = 0;
    for segment in segments {
        let mut rest = *segment;
        while count == 0 && rest.len() >= staged.len() {
            let (group, after) = rest.split_at(staged.len());
            acc = group_step(key, acc, group.try_into().unwrap());
            rest = after;
        }
        for block in rest.chunks(16) {
            let slot = &mut staged[16 * count..16 * count + 16];
            slot[..block.len()].copy_from_slice(block);
            slot[block.len()..].fill(0);
            count += 1;
            if count == GROUP_BLOCKS {
                acc = group_step(key, acc, &staged);
                count = 0;
            }
        }
    }
    if count > 0 {
        // The last `count` blocks take H^count .. H^1: the group's last `count` places.
        let mut last = [0u8; GROUP_BLOCKS * 16];
        let first = GROUP_BLOCKS - count;
        last[16 * first..].copy_from_slice(&staged[..16 * count]);
        let lead: &mut [u8; 16] = (&mut last[16 * first..16 * first + 16]).try_into().unwrap();
        *lead = store(_mm_xor_si128(load(lead), acc));
        acc = group_step(key, _mm_setzero_si128(), &last);
    }
    store(acc)
}

/// `acc` after sixteen more blocks: `(acc + X0) H^16 + X1 H^15 + ... + X15 H`, one
/// reduction.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,vpclmulqdq,pclmulqdq,avx")]
fn group_step(key: &WidePolyval, acc: __m128i, group: &[u8; GROUP_BLOCKS * 16]) -> __m128i {
    let mut r = _mm512_setzero_si512();
    let mut f = _mm512_setzero_si512();
    for k in 0..4 {
        // SAFETY: `group` is 256 bytes (its type); this reads bytes 64k..64k+64, unaligned.
        let mut m = unsafe { _mm512_loadu_si512(group.as_ptr().add(64 * k).cast()) };
        if k == 0 {
            m = _mm512_xor_si512(m, _mm512_zextsi128_si512(acc));
        }
        // SAFETY: each operand is 64 bytes of the key, read unaligned.
        let h = unsafe { _mm512_loadu_si512(key.h[k].as_ptr().cast()) };
        let d = unsafe { _mm512_loadu_si512(key.d[k].as_ptr().cast()) };
        // R = M0 D1 + M1 H1, F = M0 D0 + M1 H0, lane by lane.
        r = _mm512_xor_si512(r, _mm512_clmulepi64_epi128(m, d, 0x10));
        r = _mm512_xor_si512(r, _mm512_clmulepi64_epi128(m, h, 0x11));
        f = _mm512_xor_si512(f, _mm512_clmulepi64_epi128(m, d, 0x00));
        f = _mm512_xor_si512(f, _mm512_clmulepi64_epi128(m, h, 0x01));
    }
    reduce(fold(r), fold(f))
}

/// The four 128-bit lanes of `v` added together.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx")]
fn fold(v: __m512i) -> __m128i {
    let halves = _mm256_xor_si256(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
    _mm_xor_si128(
        _mm256_castsi256_si128(halves),
        _mm256_extracti128_si256(halves, 1),
    )
}

/// `D = swap(H) + H0 * P1`, the companion of a power of H in the R/F multiplication.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "pclmulqdq,avx")]
fn companion(h: __m128i) -> __m128i {
    let p = _mm_set_epi64x(P1 as i64, 0);
    _mm_xor_si128(_mm_shuffle_epi32(h, 0x4e), _mm_clmulepi64_si128(h, p, 0x10))
}

/// POLYVAL's product `m * h` (with `d` the companion of `h`), reduced.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "pclmulqdq,avx")]
fn mul(m: __m128i, h: __m128i, d: __m128i) -> __m128i {
    let r = _mm_xor_si128(
        _mm_clmulepi64_si128(m, d, 0x10),
        _mm_clmulepi64_si128(m, h, 0x11),
    );
    let f = _mm_xor_si128(
        _mm_clmulepi64_si128(m, d, 0x00),
        _mm_clmulepi64_si128(m, h, 0x01),
    );
    reduce(r, f)
}

/// `R + F1 + x^64 F0 + P1 F0`: the R/F form's one-CLMUL reduction.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "pclmulqdq,avx")]
fn reduce(r: __m128i, f: __m128i) -> __m128i {
    let p1 = _mm_set_epi64x(0, P1 as i64);
    let sum = _mm_xor_si128(r, _mm_srli_si128(f, 8));
    let sum = _mm_xor_si128(sum, _mm_slli_si128(f, 8));
    _mm_xor_si128(sum, _mm_clmulepi64_si128(f, p1, 0x00))
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse2")]
fn load(bytes: &[u8; 16]) -> __m128i {
    // SAFETY: 16 bytes, read unaligned.
    unsafe { _mm_loadu_si128(bytes.as_ptr().cast()) }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse2")]
fn store(v: __m128i) -> [u8; 16] {
    let mut out = [0u8; 16];
    // SAFETY: 16 bytes, written unaligned.
    unsafe { _mm_storeu_si128(out.as_mut_ptr().cast(), v) };
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use polyval::universal_hash::UniversalHash;
    use proptest::prelude::*;

    /// The `polyval` crate's hash of the same padded segments.
    fn reference(h: &[u8; 16], segments: &[&[u8]]) -> [u8; 16] {
        let mut polyval = polyval::Polyval::new(&(*h).into());
        for segment in segments {
            polyval.update_padded(segment);
        }
        polyval.finalize().into()
    }

    proptest! {
        /// Every length from empty to several groups, split anywhere into three segments,
        /// under random keys: the wide hash equals the `polyval` crate's.
        #[test]
        fn wide_polyval_is_polyval(
            h in any::<[u8; 16]>(),
            data in proptest::collection::vec(any::<u8>(), 0..1200),
            split in any::<prop::sample::Index>(),
            second in any::<prop::sample::Index>(),
        ) {
            let Some(wide) = WidePolyval::new(&h) else {
                eprintln!("skipped: no AVX-512 VPCLMULQDQ here; the MAC uses the polyval crate");
                return Ok(());
            };
            let at = split.index(data.len() + 1);
            let then = at + second.index(data.len() - at + 1);
            let segments = [&data[..at], &data[at..then], &data[then..]];
            prop_assert_eq!(wide.hash(&segments), reference(&h, &segments));
        }
    }

    /// Long inputs of all ones and of a counting pattern (many groups, a carry in every
    /// lane), against the crate.
    #[test]
    fn wide_polyval_over_many_groups() {
        let counting: Vec<u8> = (0..70_000u32).map(|i| (i * 31 + 7) as u8).collect();
        for data in [vec![0xff; 65_536 + 40], counting] {
            let h = [0xa5; 16];
            let Some(wide) = WidePolyval::new(&h) else {
                eprintln!("skipped: no AVX-512 VPCLMULQDQ here; the MAC uses the polyval crate");
                return;
            };
            assert_eq!(wide.hash(&[&data]), reference(&h, &[&data]));
        }
    }
}
