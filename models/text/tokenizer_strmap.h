// Open-addressing hash maps for the tokenizer's vocabulary: string_view keys that point into storage the
// owner keeps alive (one buffer), and 64-bit integer keys (a pair of piece ids). Built once at load,
// read-only afterwards, so lookups from several threads are safe. Much faster to build than
// std::unordered_map for 150k+ entries (no node per entry).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

namespace rp {

inline uint64_t hash_bytes(std::string_view s) {
    // FNV-1a, then a final mix so the low bits (the slot) depend on every byte.
    uint64_t h = 1469598103934665603ull;
    for (unsigned char c : s) {
        h = (h ^ c) * 1099511628211ull;
    }
    h ^= h >> 29;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 32;
    return h;
}

inline uint64_t hash_u64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

// string_view -> int32 value (>= 0). Keys are not copied. Grows when half full. One slot holds the key's
// pointer, length, value and 32 hash bits, so a probe touches one cache line and compares bytes only when
// the hash bits and length agree.
class StrMap {
public:
    // Empties the map and sizes it for n keys.
    void reserve(size_t n) {
        size_t cap = 16;
        while (cap < n * 2) {
            cap <<= 1;
        }
        slots_.assign(cap, Slot());
        mask_ = cap - 1;
        size_ = 0;
    }
    // Inserts or overwrites.
    void set(std::string_view key, int32_t val) {
        grow_if_needed();
        const uint64_t h = hash_bytes(key);
        Slot & s = slots_[probe(key, h)];
        if (s.val < 0) {
            s = Slot{key.data(), static_cast<uint32_t>(key.size()), static_cast<uint32_t>(h >> 32), val};
            ++size_;
        }
        s.val = val;
    }
    // Inserts only when absent; returns the value now stored.
    int32_t insert(std::string_view key, int32_t val) {
        grow_if_needed();
        const uint64_t h = hash_bytes(key);
        Slot & s = slots_[probe(key, h)];
        if (s.val < 0) {
            s = Slot{key.data(), static_cast<uint32_t>(key.size()), static_cast<uint32_t>(h >> 32), val};
            ++size_;
        }
        return s.val;
    }
    int32_t find(std::string_view key) const {
        if (slots_.empty()) {
            return -1;
        }
        return slots_[probe(key, hash_bytes(key))].val;
    }
    size_t size() const { return size_; }

private:
    struct Slot {
        const char * ptr = nullptr;
        uint32_t len = 0;
        uint32_t tag = 0;  // high hash bits
        int32_t val = -1;  // -1: empty
    };

    // Index of the slot holding `key`, or of the empty slot where it would go.
    size_t probe(std::string_view key, uint64_t h) const {
        const uint32_t tag = static_cast<uint32_t>(h >> 32);
        size_t i = h & mask_;
        while (true) {
            const Slot & s = slots_[i];
            if (s.val < 0 || (s.tag == tag && s.len == key.size() && std::string_view(s.ptr, s.len) == key)) {
                return i;
            }
            i = (i + 1) & mask_;
        }
    }

    void grow_if_needed() {
        if ((size_ + 1) * 2 <= slots_.size()) {
            return;
        }
        std::vector<Slot> old = std::move(slots_);
        reserve(old.size() < 16 ? 16 : old.size());  // capacity >= 2 * old capacity
        for (const Slot & o : old) {
            if (o.val >= 0) {
                slots_[probe(std::string_view(o.ptr, o.len), hash_bytes(std::string_view(o.ptr, o.len)))] = o;
                ++size_;
            }
        }
    }

    std::vector<Slot> slots_;
    size_t mask_ = 0;
    size_t size_ = 0;
};

// uint64 key -> int32 value (>= 0), first insertion wins.
class U64Map {
public:
    void reserve(size_t n) {
        size_t cap = 16;
        while (cap < n * 2) {
            cap <<= 1;
        }
        keys_.assign(cap, 0);
        vals_.assign(cap, -1);
        mask_ = cap - 1;
    }
    // Returns false when the key was already present (its value is kept).
    bool insert(uint64_t key, int32_t val) {
        size_t i = hash_u64(key) & mask_;
        while (vals_[i] >= 0) {
            if (keys_[i] == key) {
                return false;
            }
            i = (i + 1) & mask_;
        }
        keys_[i] = key;
        vals_[i] = val;
        return true;
    }
    int32_t find(uint64_t key) const {
        if (vals_.empty()) {
            return -1;
        }
        size_t i = hash_u64(key) & mask_;
        while (vals_[i] >= 0) {
            if (keys_[i] == key) {
                return vals_[i];
            }
            i = (i + 1) & mask_;
        }
        return -1;
    }

private:
    std::vector<uint64_t> keys_;
    std::vector<int32_t> vals_;
    size_t mask_ = 0;
};

} // namespace rp
