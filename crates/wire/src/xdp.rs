//! The XDP program the privileged helper attaches to an `ingress = "xdp"`
//! input's interface: it sends the flow's frames (IPv4, UDP, the flow's
//! destination and port, the source if the flow is source-specific, not
//! fragmented, no IP options) to the AF_XDP socket in its `XSKMAP` at the
//! receiving queue, and passes everything else to the kernel untouched
//! (`XDP_PASS`: ARP, IGMP, ICMP, TCP, other UDP keep working). A frame it
//! can't prove is the flow's (a VLAN tag in the frame, IP options, a
//! fragment) is passed too: the kernel's stack then handles it as if
//! there were no program, so the program can only ever take frames it is
//! sure of. When the queue has no socket in the map, `bpf_redirect_map`
//! falls back to `XDP_PASS` as well.
//!
//! Assembled here as plain eBPF instructions (as [`crate::bpf`] does for
//! classic BPF): no clang, no object file, no loader library; the helper
//! copies the instructions into the kernel with `bpf(BPF_PROG_LOAD)` and
//! the kernel's verifier checks every access against `data_end`.

use std::net::IpAddr;

use crate::frame::FlowMatch;

/// One eBPF instruction, encoded as the kernel's `struct bpf_insn` (code,
/// dst/src registers, 16-bit offset, 32-bit immediate; little-endian,
/// which is the only byte order this is built for).
pub type Insn = u64;

// Opcodes (linux/bpf.h, linux/bpf_common.h).
const LDX_MEM_W: u8 = 0x61;
const LDX_MEM_H: u8 = 0x69;
const LDX_MEM_B: u8 = 0x71;
const ALU64_MOV_K: u8 = 0xb7;
const ALU64_MOV_X: u8 = 0xbf;
const ALU64_ADD_K: u8 = 0x07;
const JMP_JGT_X: u8 = 0x2d;
const JMP_JNE_K: u8 = 0x55;
const JMP_JSET_K: u8 = 0x45;
const JMP32_JNE_K: u8 = 0x56;
const LD_IMM64: u8 = 0x18;
const CALL: u8 = 0x85;
const EXIT: u8 = 0x95;
/// `src_reg` of a `LD_IMM64` whose immediate is a map's fd.
const PSEUDO_MAP_FD: u8 = 1;
/// `bpf_redirect_map`'s helper number.
const HELPER_REDIRECT_MAP: i32 = 51;
/// `XDP_PASS`.
pub const XDP_PASS: i32 = 2;

// `struct xdp_md` field offsets.
const MD_DATA: i16 = 0;
const MD_DATA_END: i16 = 4;
const MD_RX_QUEUE_INDEX: i16 = 16;

// Frame offsets: Ethernet (14), IPv4 without options (20), UDP (8).
const ETH_TYPE: i16 = 12;
const IP_VERSION_IHL: i16 = 14;
const IP_FRAGMENT: i16 = 20;
const IP_PROTOCOL: i16 = 23;
const IP_SOURCE: i16 = 26;
const IP_DESTINATION: i16 = 30;
const UDP_DESTINATION_PORT: i16 = 36;
/// The bytes every checked field lies in.
pub const HEADERS: i32 = 14 + 20 + 8;

fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
    u64::from(code)
        | u64::from((dst & 0x0f) | (src << 4)) << 8
        | u64::from(u16::from_ne_bytes(off.to_ne_bytes())) << 16
        | u64::from(u32::from_ne_bytes(imm.to_ne_bytes())) << 32
}

/// The value a little-endian load of `bytes` (in wire order) gives.
fn loaded(bytes: &[u8]) -> i32 {
    let mut v: u32 = 0;
    for (i, b) in bytes.iter().enumerate() {
        v |= u32::from(*b) << (8 * i);
    }
    i32::from_ne_bytes(v.to_ne_bytes())
}

/// Why no program can be built for a flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProgramError {
    /// The XDP program matches IPv4 only.
    NotIpv4,
}

impl std::fmt::Display for ProgramError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ProgramError::NotIpv4 => f.write_str(
                "ingress = \"xdp\" takes IPv4 inputs only (use ingress = \"packet\" for IPv6)",
            ),
        }
    }
}

impl std::error::Error for ProgramError {}

/// The program for `flow`, redirecting to the `XSKMAP` whose fd is
/// `xsk_map_fd` (patched into a `LD_IMM64` the kernel resolves at load).
pub fn program(flow: &FlowMatch, xsk_map_fd: i32) -> Result<Vec<Insn>, ProgramError> {
    let IpAddr::V4(destination) = flow.destination else {
        return Err(ProgramError::NotIpv4);
    };
    let source = match flow.source {
        None => None,
        Some(IpAddr::V4(s)) => Some(s),
        Some(IpAddr::V6(_)) => return Err(ProgramError::NotIpv4),
    };
    // Registers: r6 the context, r2 data, r3 data_end, r4 scratch.
    // `None` marks a jump to the pass block, patched below.
    let mut p: Vec<(Insn, bool)> = Vec::with_capacity(32);
    let mut op = |i: Insn| p.push((i, false));
    op(insn(ALU64_MOV_X, 6, 1, 0, 0));
    op(insn(LDX_MEM_W, 2, 6, MD_DATA, 0));
    op(insn(LDX_MEM_W, 3, 6, MD_DATA_END, 0));
    op(insn(ALU64_MOV_X, 4, 2, 0, 0));
    op(insn(ALU64_ADD_K, 4, 0, 0, HEADERS));
    let mut to_pass = Vec::new();
    let mut jump = |p: &mut Vec<(Insn, bool)>, code: u8, dst: u8, src: u8, imm: i32| {
        to_pass.push(p.len());
        p.push((insn(code, dst, src, 0, imm), true));
    };
    jump(&mut p, JMP_JGT_X, 4, 3, 0);
    p.push((insn(LDX_MEM_H, 4, 2, ETH_TYPE, 0), false));
    jump(&mut p, JMP_JNE_K, 4, 0, loaded(&[0x08, 0x00]));
    p.push((insn(LDX_MEM_B, 4, 2, IP_VERSION_IHL, 0), false));
    jump(&mut p, JMP_JNE_K, 4, 0, 0x45);
    p.push((insn(LDX_MEM_B, 4, 2, IP_PROTOCOL, 0), false));
    jump(&mut p, JMP_JNE_K, 4, 0, 17);
    // More-fragments flag or a fragment offset: any fragment passes.
    p.push((insn(LDX_MEM_H, 4, 2, IP_FRAGMENT, 0), false));
    jump(&mut p, JMP_JSET_K, 4, 0, loaded(&[0x3f, 0xff]));
    p.push((insn(LDX_MEM_W, 4, 2, IP_DESTINATION, 0), false));
    jump(&mut p, JMP32_JNE_K, 4, 0, loaded(&destination.octets()));
    if let Some(s) = source {
        p.push((insn(LDX_MEM_W, 4, 2, IP_SOURCE, 0), false));
        jump(&mut p, JMP32_JNE_K, 4, 0, loaded(&s.octets()));
    }
    p.push((insn(LDX_MEM_H, 4, 2, UDP_DESTINATION_PORT, 0), false));
    jump(&mut p, JMP_JNE_K, 4, 0, loaded(&flow.port.to_be_bytes()));
    // return bpf_redirect_map(&xsks, ctx->rx_queue_index, XDP_PASS);
    p.push((insn(LD_IMM64, 1, PSEUDO_MAP_FD, 0, xsk_map_fd), false));
    p.push((insn(0, 0, 0, 0, 0), false));
    p.push((insn(LDX_MEM_W, 2, 6, MD_RX_QUEUE_INDEX, 0), false));
    p.push((insn(ALU64_MOV_K, 3, 0, 0, XDP_PASS), false));
    p.push((insn(CALL, 0, 0, 0, HELPER_REDIRECT_MAP), false));
    p.push((insn(EXIT, 0, 0, 0, 0), false));
    let pass = p.len();
    p.push((insn(ALU64_MOV_K, 0, 0, 0, XDP_PASS), false));
    p.push((insn(EXIT, 0, 0, 0, 0), false));
    let mut out: Vec<Insn> = p.iter().map(|(i, _)| *i).collect();
    for at in to_pass {
        // Forward jumps within a program of a few dozen instructions: the
        // offset fits in an i16.
        let off = i16::try_from(pass - at - 1).unwrap_or(i16::MAX);
        out[at] |= u64::from(u16::from_ne_bytes(off.to_ne_bytes())) << 16;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;

    fn flow(source: Option<IpAddr>) -> FlowMatch {
        FlowMatch {
            destination: IpAddr::V4(Ipv4Addr::new(239, 1, 2, 200)),
            port: 5000,
            source,
        }
    }

    fn code(i: Insn) -> u8 {
        (i & 0xff) as u8
    }

    fn off(i: Insn) -> i16 {
        i16::from_ne_bytes(i.to_le_bytes()[2..4].try_into().unwrap_or([0; 2]))
    }

    fn imm(i: Insn) -> i32 {
        i32::from_ne_bytes(i.to_le_bytes()[4..8].try_into().unwrap_or([0; 4]))
    }

    #[test]
    fn every_conditional_jump_lands_on_the_pass_block() {
        for source in [None, Some(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)))] {
            let p = program(&flow(source), 7).expect("ipv4");
            let pass = p.len() - 2;
            assert_eq!(code(p[pass]), ALU64_MOV_K);
            assert_eq!(imm(p[pass]), XDP_PASS);
            let jumps: Vec<usize> = (0..p.len())
                .filter(|&i| matches!(code(p[i]), JMP_JGT_X | JMP_JNE_K | JMP_JSET_K | JMP32_JNE_K))
                .collect();
            assert_eq!(jumps.len(), if source.is_some() { 8 } else { 7 });
            for j in jumps {
                assert_eq!(
                    j + 1 + usize::try_from(off(p[j])).expect("forward"),
                    pass,
                    "jump at {j}"
                );
            }
        }
    }

    #[test]
    fn compares_the_wire_bytes_as_the_kernel_loads_them() {
        let p = program(&flow(None), 7).expect("ipv4");
        // The destination compare is a 32-bit one (a 64-bit compare would
        // sign-extend 239.1.2.200's last octet into the high word).
        let dst = p.iter().find(|&&i| code(i) == JMP32_JNE_K).expect("jne32");
        assert_eq!(imm(*dst).to_le_bytes(), [239, 1, 2, 200]);
        let port = p
            .iter()
            .rev()
            .find(|&&i| code(i) == JMP_JNE_K)
            .expect("port");
        assert_eq!(
            imm(*port),
            i32::from(u16::from_le_bytes(5000u16.to_be_bytes()))
        );
        let map = p.iter().find(|&&i| code(i) == LD_IMM64).expect("map");
        assert_eq!(imm(*map), 7);
        assert_eq!((*map >> 12) & 0xf, u64::from(PSEUDO_MAP_FD));
    }

    #[test]
    fn refuses_ipv6() {
        let v6 = FlowMatch {
            destination: "ff3e::1".parse().expect("v6"),
            port: 5000,
            source: None,
        };
        assert_eq!(program(&v6, 3), Err(ProgramError::NotIpv4));
    }
}
