//! Pool buffers waiting for their egress sends to complete, keyed by a slot
//! number that travels in each send's io_uring `user_data`. Pre-allocated
//! to the pool's capacity (a pool buffer is in at most one slot), so insert
//! never allocates and never fails while the pool is the one feeding it.

use mcrelay_pool::{Buffer, Released, SharedBuffer};

#[derive(Debug)]
pub struct InFlight {
    slots: Vec<Option<SharedBuffer>>,
    free: Vec<u32>,
}

impl InFlight {
    pub fn with_capacity(capacity: u32) -> Self {
        Self {
            slots: (0..capacity).map(|_| None).collect(),
            free: (0..capacity).rev().collect(),
        }
    }

    /// Park a buffer; its slot number, or the buffer back when every slot
    /// is taken.
    pub fn insert(&mut self, buf: SharedBuffer) -> Result<u32, SharedBuffer> {
        let Some(slot) = self.free.pop() else {
            return Err(buf);
        };
        match self.slots.get_mut(slot as usize) {
            Some(entry @ None) => {
                *entry = Some(buf);
                Ok(slot)
            }
            // Unreachable by construction (free holds only empty, in-range
            // slots); refuse rather than overwrite.
            _ => Err(buf),
        }
    }

    /// One send of the buffer in `slot` completed: the buffer, when that was
    /// its last pending use. Unknown or empty slots yield `None`.
    pub fn complete_one(&mut self, slot: u32) -> Option<Buffer> {
        let entry = self.slots.get_mut(slot as usize)?;
        match entry.take()?.release() {
            Released::Pending(rest) => {
                *entry = Some(rest);
                None
            }
            Released::Last(buf) => {
                self.free.push(slot);
                Some(buf)
            }
        }
    }

    /// The buffer parked in `slot`, for reading its address when a send is
    /// built. `None` for a free or unknown slot.
    pub fn buffer(&self, slot: u32) -> Option<&Buffer> {
        self.slots
            .get(slot as usize)?
            .as_ref()
            .map(SharedBuffer::buffer)
    }

    /// Slots this table has.
    pub fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// Buffers still waiting for sends.
    pub fn len(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mcrelay_pool::{PoolConfig, PoolSet};

    #[test]
    fn buffer_returns_after_its_last_send() {
        let mut pool = PoolSet::new(PoolConfig {
            small: 2,
            standard: 1,
            jumbo: 1,
        })
        .expect("pool");
        let mut table = InFlight::with_capacity(1);
        let buf = pool.take_filled(b"x").expect("buf");
        let slot = table
            .insert(SharedBuffer::new(buf, 2).expect("2 uses"))
            .expect("slot");
        let other = SharedBuffer::new(pool.take_filled(b"y").expect("buf"), 1).expect("1 use");
        let other = table.insert(other).expect_err("table full");
        assert!(table.complete_one(slot).is_none(), "one send still pending");
        let buf = table.complete_one(slot).expect("last send");
        assert!(table.is_empty());
        assert!(table.complete_one(slot).is_none(), "slot is empty now");
        assert!(table.complete_one(99).is_none(), "unknown slot");
        pool.give(buf).expect("home");
        match other.release() {
            Released::Last(b) => pool.give(b).expect("home"),
            Released::Pending(_) => panic!("single use"),
        }
    }
}
