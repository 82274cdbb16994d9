//! (Only the `uring` method uses this; the product reads a TPACKET_V3
//! ring, whose frame headers carry the same status.)
//!
//! The kernel's note on a captured frame (`PACKET_AUXDATA` control
//! message): whether the UDP checksum still needs checking. A frame from
//! this host's own stack over a virtual link (veth, a VM's virtio) carries
//! a checksum that is not filled in yet (`TP_STATUS_CSUMNOTREADY`); one the
//! NIC verified is marked `TP_STATUS_CSUM_VALID`. Anything else is checked
//! in software.

/// `SOL_PACKET`, `PACKET_AUXDATA` (linux/socket.h, linux/if_packet.h).
const SOL_PACKET: i32 = 263;
const PACKET_AUXDATA: i32 = 8;
const TP_STATUS_CSUMNOTREADY: u32 = 1 << 3;
const TP_STATUS_CSUM_VALID: u32 = 1 << 7;

/// `struct cmsghdr`: `size_t cmsg_len; int cmsg_level; int cmsg_type;`,
/// data aligned to `size_t`.
const WORD: usize = size_of::<usize>();
const HEADER: usize = WORD + 8;

/// Bytes a receive needs for the auxdata control message
/// (`CMSG_SPACE(sizeof(struct tpacket_auxdata))`).
pub const CONTROL_BYTES: usize = align(HEADER) + align(20);

const fn align(n: usize) -> usize {
    (n + WORD - 1) & !(WORD - 1)
}

fn read<const N: usize>(bytes: &[u8], at: usize) -> Option<[u8; N]> {
    let mut out = [0u8; N];
    out.copy_from_slice(bytes.get(at..at.checked_add(N)?)?);
    Some(out)
}

/// The `tp_status` of the auxdata message in `control`, if there is one.
pub fn status(control: &[u8]) -> Option<u32> {
    let mut at = 0;
    while at + HEADER <= control.len() {
        let len = usize::from_ne_bytes(read::<WORD>(control, at)?);
        if len < HEADER || len > control.len() - at {
            return None;
        }
        let level = i32::from_ne_bytes(read(control, at + WORD)?);
        let kind = i32::from_ne_bytes(read(control, at + WORD + 4)?);
        if level == SOL_PACKET && kind == PACKET_AUXDATA {
            return read::<4>(control, at + align(HEADER)).map(u32::from_ne_bytes);
        }
        at = at.checked_add(align(len))?;
    }
    None
}

/// Whether the UDP checksum of a frame with this auxdata must be checked in
/// software. Without auxdata: yes.
pub fn checksum_needs_checking(control: &[u8]) -> bool {
    status(control).is_none_or(|s| s & (TP_STATUS_CSUMNOTREADY | TP_STATUS_CSUM_VALID) == 0)
}
