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

/// A control buffer holding one auxdata message with `tp_status`, as the
/// kernel writes it (for tests).
pub fn encode(tp_status: u32) -> [u8; CONTROL_BYTES] {
    let mut c = [0u8; CONTROL_BYTES];
    c[..WORD].copy_from_slice(&(HEADER + 20).to_ne_bytes());
    c[WORD..WORD + 4].copy_from_slice(&SOL_PACKET.to_ne_bytes());
    c[WORD + 4..WORD + 8].copy_from_slice(&PACKET_AUXDATA.to_ne_bytes());
    c[align(HEADER)..align(HEADER) + 4].copy_from_slice(&tp_status.to_ne_bytes());
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checksum_status_is_read_from_the_auxdata() {
        assert!(checksum_needs_checking(&encode(1)), "TP_STATUS_USER only");
        assert!(!checksum_needs_checking(&encode(
            1 | TP_STATUS_CSUMNOTREADY
        )));
        assert!(!checksum_needs_checking(&encode(TP_STATUS_CSUM_VALID)));
        assert!(checksum_needs_checking(&[]), "no auxdata: check");
    }

    #[test]
    fn hostile_control_bytes_are_harmless() {
        assert_eq!(status(&[0xff; 64]), None);
        assert_eq!(status(&[0; 64]), None, "a zero cmsg_len stops the walk");
        let mut c = encode(5);
        c[0] = 0xff;
        assert_eq!(status(&c), None, "a length past the buffer");
    }
}
