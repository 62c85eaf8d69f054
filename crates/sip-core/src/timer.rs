//! A hierarchical timing wheel: O(1) insert, O(1) cancel, amortised O(1) expiry.
//!
//! Seed 004 found a proxy losing 10x because inserting a transaction timer walked a sorted
//! list; seed 000 found half a server's CPU spent scanning connections for idle timeouts. Every
//! timer in sipsec (transaction timers A–M, registration expiry, connection idle timeouts) lives
//! on one of these wheels instead, one wheel per worker, so no timer operation is proportional
//! to the number of timers.
//!
//! Why our own and not `tokio::time`: the protocol core is sans-IO (it is handed "now" and asked
//! for its next deadline), it runs single-threaded per worker, and it needs the expired payloads
//! back as values, not wakers. The layout follows tokio's wheel: six levels of 64 slots at a
//! 1 ms tick (a span of 2^36 ms, about two years); a timer sits at the level of the highest
//! 6-bit group where its deadline differs from the current time and cascades down as time
//! passes. Entries live in a slab with intrusive doubly linked slot lists, so cancel is an
//! unlink, and a handle carries a generation so a stale handle cancels nothing.

/// Milliseconds on the caller's clock (any monotonic origin).
pub type Millis = u64;

const LEVELS: usize = 6;
const SLOT_BITS: u32 = 6;
const SLOTS: usize = 1 << SLOT_BITS;
const NIL: u32 = u32::MAX;
/// The furthest a deadline may be from "now"; later deadlines are clamped to it.
const MAX_SPAN: Millis = (1 << (SLOT_BITS * LEVELS as u32)) - 1;

/// Identifies a scheduled timer. Cheap to copy; cancelling a fired or cancelled timer is a no-op.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TimerHandle {
    index: u32,
    generation: u32,
}

#[derive(Debug)]
struct Entry<T> {
    deadline: Millis,
    generation: u32,
    /// `None` while the entry is on the free list.
    value: Option<T>,
    prev: u32,
    next: u32,
    /// Which list holds the entry: `level * SLOTS + slot`, or `DUE_LIST`.
    list: u32,
}

const DUE_LIST: u32 = (LEVELS * SLOTS) as u32;

/// A timing wheel holding values of type `T` until their deadline passes.
#[derive(Debug)]
pub struct TimerWheel<T> {
    entries: Vec<Entry<T>>,
    free: Vec<u32>,
    /// Heads of the slot lists, plus one list for timers already due when inserted.
    heads: Vec<u32>,
    occupied: [u64; LEVELS],
    elapsed: Millis,
    len: usize,
}

impl<T> TimerWheel<T> {
    /// A wheel whose clock starts at `now`.
    pub fn new(now: Millis) -> Self {
        TimerWheel {
            entries: Vec::new(),
            free: Vec::new(),
            heads: vec![NIL; LEVELS * SLOTS + 1],
            occupied: [0; LEVELS],
            elapsed: now,
            len: 0,
        }
    }

    /// Number of pending timers.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when no timer is pending.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The wheel's notion of the current time (the last `advance`).
    pub fn now(&self) -> Millis {
        self.elapsed
    }

    /// Schedules `value` to expire at `deadline`. A deadline not after the wheel's current time
    /// expires on the next `advance`.
    pub fn insert(&mut self, deadline: Millis, value: T) -> TimerHandle {
        let deadline = deadline.min(self.elapsed.saturating_add(MAX_SPAN));
        let index = match self.free.pop() {
            Some(i) => {
                let e = &mut self.entries[i as usize];
                e.deadline = deadline;
                e.value = Some(value);
                i
            }
            None => {
                self.entries.push(Entry {
                    deadline,
                    generation: 0,
                    value: Some(value),
                    prev: NIL,
                    next: NIL,
                    list: NIL,
                });
                (self.entries.len() - 1) as u32
            }
        };
        self.len += 1;
        self.link(index);
        TimerHandle {
            index,
            generation: self.entries[index as usize].generation,
        }
    }

    /// Cancels a timer, returning its value if it was still pending.
    pub fn cancel(&mut self, handle: TimerHandle) -> Option<T> {
        let e = self.entries.get(handle.index as usize)?;
        if e.generation != handle.generation || e.value.is_none() {
            return None;
        }
        self.unlink(handle.index);
        Some(self.release(handle.index))
    }

    /// The earliest time at which `advance` may expire something: exact for timers within the
    /// next 64 ms, a lower bound (the start of a slot to cascade) beyond that.
    pub fn next_deadline(&self) -> Option<Millis> {
        if self.heads[DUE_LIST as usize] != NIL {
            return Some(self.elapsed);
        }
        (0..LEVELS).find_map(|level| self.next_expiration(level).map(|(_, deadline)| deadline))
    }

    /// Advances the clock to `now`, appending every expired value to `expired` in deadline order
    /// (the order among timers sharing a millisecond is unspecified).
    pub fn advance(&mut self, now: Millis, expired: &mut Vec<T>) {
        self.drain_list(DUE_LIST, expired);
        while let Some((level, slot, deadline)) =
            (0..LEVELS).find_map(|level| self.next_expiration(level).map(|(s, d)| (level, s, d)))
        {
            if deadline > now {
                break;
            }
            self.elapsed = deadline;
            let list = (level * SLOTS + slot) as u32;
            if level == 0 {
                self.drain_list(list, expired);
            } else {
                // Cascade: re-file every entry of this slot relative to the new time.
                let mut cursor = self.take_list(list);
                while cursor != NIL {
                    let next = self.entries[cursor as usize].next;
                    if self.entries[cursor as usize].deadline <= self.elapsed {
                        self.len -= 1;
                        expired.push(self.release_unlinked(cursor));
                    } else {
                        self.link(cursor);
                    }
                    cursor = next;
                }
            }
        }
        if now > self.elapsed {
            self.elapsed = now;
        }
    }

    fn drain_list(&mut self, list: u32, expired: &mut Vec<T>) {
        let mut cursor = self.take_list(list);
        while cursor != NIL {
            let next = self.entries[cursor as usize].next;
            self.len -= 1;
            expired.push(self.release_unlinked(cursor));
            cursor = next;
        }
    }

    /// Detaches a whole list, returning its first entry; the entries keep their `next` links.
    fn take_list(&mut self, list: u32) -> u32 {
        let head = std::mem::replace(&mut self.heads[list as usize], NIL);
        if list != DUE_LIST {
            let level = list as usize / SLOTS;
            let slot = list as usize % SLOTS;
            self.occupied[level] &= !(1u64 << slot);
        }
        head
    }

    fn next_expiration(&self, level: usize) -> Option<(usize, Millis)> {
        let occupied = self.occupied[level];
        if occupied == 0 {
            return None;
        }
        let shift = SLOT_BITS * level as u32;
        let slot_range: Millis = 1 << shift;
        let level_range: Millis = slot_range << SLOT_BITS;
        let now_slot = ((self.elapsed >> shift) & (SLOTS as u64 - 1)) as u32;
        let slot = (occupied.rotate_right(now_slot).trailing_zeros() + now_slot) as usize % SLOTS;
        let level_start = self.elapsed & !(level_range - 1);
        let mut deadline = level_start + slot as Millis * slot_range;
        if deadline <= self.elapsed {
            // Only the top level wraps: its slots form a ring beyond the last level.
            deadline += level_range;
        }
        Some((slot, deadline))
    }

    fn link(&mut self, index: u32) {
        let deadline = self.entries[index as usize].deadline;
        let list = if deadline <= self.elapsed {
            DUE_LIST
        } else {
            let masked = (self.elapsed ^ deadline) | (SLOTS as u64 - 1);
            let significant = 63 - masked.leading_zeros();
            let level = ((significant / SLOT_BITS) as usize).min(LEVELS - 1);
            let slot = ((deadline >> (SLOT_BITS * level as u32)) & (SLOTS as u64 - 1)) as usize;
            self.occupied[level] |= 1u64 << slot;
            (level * SLOTS + slot) as u32
        };
        let head = self.heads[list as usize];
        {
            let e = &mut self.entries[index as usize];
            e.list = list;
            e.prev = NIL;
            e.next = head;
        }
        if head != NIL {
            self.entries[head as usize].prev = index;
        }
        self.heads[list as usize] = index;
    }

    fn unlink(&mut self, index: u32) {
        let (prev, next, list) = {
            let e = &self.entries[index as usize];
            (e.prev, e.next, e.list)
        };
        if prev != NIL {
            self.entries[prev as usize].next = next;
        } else {
            self.heads[list as usize] = next;
            if next == NIL && list != DUE_LIST {
                let level = list as usize / SLOTS;
                self.occupied[level] &= !(1u64 << (list as usize % SLOTS));
            }
        }
        if next != NIL {
            self.entries[next as usize].prev = prev;
        }
    }

    fn release(&mut self, index: u32) -> T {
        self.len -= 1;
        self.release_unlinked(index)
    }

    fn release_unlinked(&mut self, index: u32) -> T {
        let e = &mut self.entries[index as usize];
        e.generation = e.generation.wrapping_add(1);
        e.list = NIL;
        self.free.push(index);
        e.value
            .take()
            .expect("linked timer entries always hold a value")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn advance(w: &mut TimerWheel<u32>, now: Millis) -> Vec<u32> {
        let mut out = Vec::new();
        w.advance(now, &mut out);
        out
    }

    #[test]
    fn fires_at_deadline_not_before() {
        let mut w = TimerWheel::new(0);
        w.insert(500, 1);
        assert!(advance(&mut w, 499).is_empty());
        assert_eq!(advance(&mut w, 500), vec![1]);
        assert!(w.is_empty());
    }

    #[test]
    fn cascades_across_levels_in_deadline_order() {
        let mut w = TimerWheel::new(1_000);
        let deadlines = [
            1_000 + 32_000,
            1_000 + 500,
            1_000 + 4_000,
            1_000 + 64,
            1_000 + 3_600_000,
        ];
        for (i, d) in deadlines.iter().enumerate() {
            w.insert(*d, i as u32);
        }
        let mut fired = Vec::new();
        let mut now = 1_000;
        while !w.is_empty() {
            let next = w.next_deadline().unwrap();
            assert!(next >= now, "deadline went backwards");
            now = next;
            for v in advance(&mut w, now) {
                assert!(deadlines[v as usize] <= now, "fired early");
                fired.push((v, now));
            }
        }
        let order: Vec<u32> = fired.iter().map(|f| f.0).collect();
        assert_eq!(order, vec![3, 1, 2, 0, 4]);
        for (v, at) in fired {
            assert_eq!(at, deadlines[v as usize], "timer {v} fired late");
        }
    }

    #[test]
    fn cancel_removes_and_stale_handles_do_nothing() {
        let mut w = TimerWheel::new(0);
        let a = w.insert(100, 1);
        let b = w.insert(100, 2);
        assert_eq!(w.cancel(a), Some(1));
        assert_eq!(w.cancel(a), None);
        let c = w.insert(100, 3); // reuses a's slab slot with a new generation
        assert_eq!(w.cancel(a), None);
        let mut fired = advance(&mut w, 100);
        fired.sort_unstable();
        assert_eq!(fired, vec![2, 3]);
        assert_eq!(w.cancel(b), None);
        assert_eq!(w.cancel(c), None);
    }

    #[test]
    fn past_deadlines_fire_on_next_advance() {
        let mut w = TimerWheel::new(10_000);
        w.insert(5, 7);
        assert_eq!(w.next_deadline(), Some(10_000));
        assert_eq!(advance(&mut w, 10_000), vec![7]);
    }

    #[test]
    fn large_jump_fires_everything_due() {
        let mut w = TimerWheel::new(0);
        for i in 0..10_000u32 {
            w.insert(u64::from(i) * 37 % 100_000, i);
        }
        let out = advance(&mut w, 100_000);
        assert_eq!(out.len(), 10_000);
        assert!(w.is_empty());
    }

    #[test]
    fn matches_a_sorted_reference_under_random_operations() {
        // A deterministic pseudo-random workload checked against a brute-force model.
        let mut seed: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut rand = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let mut w = TimerWheel::new(0);
        let mut model: Vec<(Millis, u32, TimerHandle)> = Vec::new();
        let mut now = 0;
        for id in 0..20_000u32 {
            match rand() % 4 {
                0 | 1 => {
                    let d = now + rand() % 200_000;
                    let h = w.insert(d, id);
                    model.push((d, id, h));
                }
                2 if !model.is_empty() => {
                    let i = (rand() as usize) % model.len();
                    let (_, v, h) = model.swap_remove(i);
                    assert_eq!(w.cancel(h), Some(v));
                }
                _ => {
                    now += rand() % 5_000;
                    let mut fired = advance(&mut w, now);
                    let mut due: Vec<u32> =
                        model.iter().filter(|m| m.0 <= now).map(|m| m.1).collect();
                    model.retain(|m| m.0 > now);
                    fired.sort_unstable();
                    due.sort_unstable();
                    assert_eq!(fired, due, "at t={now}");
                }
            }
            assert_eq!(w.len(), model.len());
        }
    }
}
