//! The three buffer size classes and how a payload length picks one.

/// Largest payload any pool buffer can hold (the jumbo class).
pub const MAX_PAYLOAD: usize = 9000;

/// A buffer size class.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Class {
    /// 1500 bytes: one Ethernet MTU.
    Small = 0,
    /// 4096 bytes.
    Standard = 1,
    /// 9000 bytes: a jumbo frame.
    Jumbo = 2,
}

impl Class {
    /// Every class, smallest first; also the index order of per-class arrays.
    pub const ALL: [Class; 3] = [Class::Small, Class::Standard, Class::Jumbo];

    /// Bytes each buffer of this class holds.
    #[inline]
    pub const fn size(self) -> usize {
        match self {
            Class::Small => 1500,
            Class::Standard => 4096,
            Class::Jumbo => 9000,
        }
    }

    /// The smallest class that holds `len` bytes, or `None` above
    /// [`MAX_PAYLOAD`].
    #[inline]
    pub const fn for_len(len: usize) -> Option<Class> {
        if len <= 1500 {
            Some(Class::Small)
        } else if len <= 4096 {
            Some(Class::Standard)
        } else if len <= MAX_PAYLOAD {
            Some(Class::Jumbo)
        } else {
            None
        }
    }

    /// Position in [`Class::ALL`] and in per-class arrays.
    #[inline]
    pub const fn index(self) -> usize {
        self as usize
    }

    /// The class at `index` (only the low two bits are looked at; 3 maps
    /// to jumbo, which callers never produce).
    #[inline(always)]
    pub(crate) const fn from_index(index: u32) -> Class {
        match index & 3 {
            0 => Class::Small,
            1 => Class::Standard,
            _ => Class::Jumbo,
        }
    }

    /// Lower-case name used in metrics labels and benchmark IDs.
    pub const fn name(self) -> &'static str {
        match self {
            Class::Small => "small",
            Class::Standard => "standard",
            Class::Jumbo => "jumbo",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boundaries_pick_the_smallest_fitting_class() {
        assert_eq!(Class::for_len(0), Some(Class::Small));
        assert_eq!(Class::for_len(1500), Some(Class::Small));
        assert_eq!(Class::for_len(1501), Some(Class::Standard));
        assert_eq!(Class::for_len(4096), Some(Class::Standard));
        assert_eq!(Class::for_len(4097), Some(Class::Jumbo));
        assert_eq!(Class::for_len(9000), Some(Class::Jumbo));
        assert_eq!(Class::for_len(9001), None);
        assert_eq!(Class::for_len(usize::MAX), None);
    }

    #[test]
    fn index_matches_all_order() {
        for (i, c) in Class::ALL.iter().enumerate() {
            assert_eq!(c.index(), i);
        }
    }
}
