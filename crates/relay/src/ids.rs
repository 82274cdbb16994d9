//! The numbers the data plane names things by, one type each.

/// A flow's number inside one worker: the index of its slot, carried in
/// every receive's and send's io_uring `user_data`. At most
/// [`FlowId::LIMIT`] of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FlowId(u16);

impl FlowId {
    /// Flow numbers a worker can hand out (13 bits of a send's
    /// `user_data`).
    pub const LIMIT: usize = 1 << 13;

    /// The flow at `index`, if it is below [`FlowId::LIMIT`].
    pub fn new(index: usize) -> Option<Self> {
        (index < Self::LIMIT)
            .then(|| u16::try_from(index).ok())
            .flatten()
            .map(Self)
    }

    /// Its slot index.
    pub fn index(self) -> usize {
        usize::from(self.0)
    }

    /// The raw number (for `user_data`).
    pub fn get(self) -> u16 {
        self.0
    }
}

/// An output's position in its flow's output list (config order).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OutputId(pub u16);

impl OutputId {
    pub fn index(self) -> usize {
        usize::from(self.0)
    }
}

/// A pool buffer's place in the in-flight table while its sends are out:
/// what a plain send's completion names.
pub type Slot = u32;
