//! The classic BPF program the privileged helper attaches to a flow's
//! AF_PACKET socket, so the kernel hands the worker only that flow's frames:
//! IPv4 or IPv6 (behind up to two in-band VLAN tags), UDP, the flow's
//! destination and port, the source if the flow is source-specific. It
//! drops frames this host sent (`PACKET_OUTGOING`: the relay's own output
//! can never loop back in). A VLAN tag the kernel has already stripped
//! (it always strips the outer one before packet sockets see the frame)
//! doesn't matter: on a trunk interface the flow takes its group from any
//! VLAN; on a VLAN interface (`eth0.100`) only that VLAN's frames arrive.
//! Fragments of the flow's
//! destination and IPv6 packets with extension headers pass, so the worker
//! can count fragments and walk extension chains the filter can't.
//!
//! The program is built here as plain data and checked by a small
//! interpreter in the tests; the helper only copies it into the kernel.

use std::net::IpAddr;

use crate::frame::FlowMatch;

/// One classic BPF instruction, laid out as the kernel's `struct
/// sock_filter`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C)]
pub struct Instruction {
    /// Opcode.
    pub code: u16,
    /// Jump offset if true.
    pub jt: u8,
    /// Jump offset if false.
    pub jf: u8,
    /// Operand.
    pub k: u32,
}

// Opcode parts (linux/bpf_common.h).
const LD: u16 = 0x00;
const LDX: u16 = 0x01;
const ALU: u16 = 0x04;
const JMP: u16 = 0x05;
const RET: u16 = 0x06;
const MISC: u16 = 0x07;
const W: u16 = 0x00;
const H: u16 = 0x08;
const B: u16 = 0x10;
const IMM: u16 = 0x00;
const ABS: u16 = 0x20;
const IND: u16 = 0x40;
const ADD: u16 = 0x00;
const AND: u16 = 0x50;
const LSH: u16 = 0x60;
const JEQ: u16 = 0x10;
const JSET: u16 = 0x40;
const K: u16 = 0x00;
const X: u16 = 0x08;
const TAX: u16 = 0x00;

/// Ancillary loads (linux/filter.h): `SKF_AD_OFF` plus the field.
const SKF_AD_OFF: u32 = 0u32.wrapping_sub(0x1000);
const SKF_AD_PKTTYPE: u32 = 4;
/// `PACKET_OUTGOING` (linux/if_packet.h).
const PACKET_OUTGOING: u32 = 4;

/// Bytes of an accepted frame the kernel keeps: all of it.
const ACCEPT_BYTES: u32 = 0x0004_0000;

/// Where a jump goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Target {
    Next,
    Accept,
    Drop,
    Label(usize),
}

#[derive(Debug, Clone, Copy)]
enum Op {
    Plain(u16, u32),
    Jump(u16, u32, Target, Target),
    Label(usize),
}

/// Assembles instructions with symbolic jump targets.
#[derive(Debug, Default)]
struct Asm {
    ops: Vec<Op>,
}

impl Asm {
    fn op(&mut self, code: u16, k: u32) {
        self.ops.push(Op::Plain(code, k));
    }

    fn jump(&mut self, code: u16, k: u32, jt: Target, jf: Target) {
        self.ops.push(Op::Jump(code, k, jt, jf));
    }

    fn label(&mut self, id: usize) {
        self.ops.push(Op::Label(id));
    }

    /// Require `A == k`, else drop.
    fn require(&mut self, k: u32) {
        self.jump(JMP | JEQ | K, k, Target::Next, Target::Drop);
    }

    /// Resolve labels; `accept` and `drop` are appended at the end.
    fn finish(mut self) -> Vec<Instruction> {
        const ACCEPT: usize = usize::MAX;
        const DROP: usize = usize::MAX - 1;
        self.label(ACCEPT);
        self.op(RET | K, ACCEPT_BYTES);
        self.label(DROP);
        self.op(RET | K, 0);
        let mut at = Vec::new();
        let mut n = 0;
        for op in &self.ops {
            match op {
                Op::Label(id) => at.push((*id, n)),
                _ => n += 1,
            }
        }
        let find = |id: usize| at.iter().find(|(l, _)| *l == id).map(|(_, i)| *i);
        let mut out = Vec::with_capacity(n);
        for op in &self.ops {
            let here = out.len();
            let offset = |t: Target| -> u8 {
                let to = match t {
                    Target::Next => here + 1,
                    Target::Accept => find(ACCEPT).unwrap_or(here + 1),
                    Target::Drop => find(DROP).unwrap_or(here + 1),
                    Target::Label(id) => find(id).unwrap_or(here + 1),
                };
                // Programs here are a few dozen instructions; a jump never
                // exceeds 255.
                u8::try_from(to - here - 1).unwrap_or(u8::MAX)
            };
            match *op {
                Op::Label(_) => {}
                Op::Plain(code, k) => out.push(Instruction {
                    code,
                    jt: 0,
                    jf: 0,
                    k,
                }),
                Op::Jump(code, k, jt, jf) => out.push(Instruction {
                    code,
                    jt: offset(jt),
                    jf: offset(jf),
                    k,
                }),
            }
        }
        out
    }
}

fn words(addr: IpAddr) -> Vec<u32> {
    match addr {
        IpAddr::V4(a) => vec![u32::from(a)],
        IpAddr::V6(a) => a
            .octets()
            .chunks_exact(4)
            .map(|c| u32::from_be_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
    }
}

/// The filter for one flow.
pub fn flow_filter(flow: &FlowMatch) -> Vec<Instruction> {
    const TAG1: usize = 1;
    const TAG2: usize = 2;
    const L3: usize = 3;
    const UDP6: usize = 4;
    let mut a = Asm::default();
    a.op(LD | W | ABS, SKF_AD_OFF.wrapping_add(SKF_AD_PKTTYPE));
    a.jump(JMP | JEQ | K, PACKET_OUTGOING, Target::Drop, Target::Next);
    // X: where the IP header starts; A: the ethertype found there.
    a.op(LDX | W | IMM, 14);
    a.op(LD | H | ABS, 12);
    a.jump(JMP | JEQ | K, 0x8100, Target::Label(TAG1), Target::Next);
    a.jump(
        JMP | JEQ | K,
        0x88a8,
        Target::Label(TAG1),
        Target::Label(L3),
    );
    a.label(TAG1);
    a.op(LDX | W | IMM, 18);
    a.op(LD | H | ABS, 16);
    a.jump(JMP | JEQ | K, 0x8100, Target::Label(TAG2), Target::Next);
    a.jump(
        JMP | JEQ | K,
        0x88a8,
        Target::Label(TAG2),
        Target::Label(L3),
    );
    a.label(TAG2);
    a.op(LDX | W | IMM, 22);
    a.op(LD | H | ABS, 20);
    a.label(L3);
    match flow.destination {
        IpAddr::V4(_) => {
            a.require(0x0800);
            a.op(LD | B | IND, 9);
            a.require(17);
            a.op(LD | W | IND, 16);
            a.require(words(flow.destination)[0]);
            if let Some(source) = flow.source {
                a.op(LD | W | IND, 12);
                a.require(words(source)[0]);
            }
            // A fragment of the flow's destination: the worker counts it.
            a.op(LD | H | IND, 6);
            a.jump(JMP | JSET | K, 0x3fff, Target::Accept, Target::Next);
            // X += IHL * 4: X now points at UDP.
            a.op(LD | B | IND, 0);
            a.op(ALU | AND | K, 0x0f);
            a.op(ALU | LSH | K, 2);
            a.op(ALU | ADD | X, 0);
            a.op(MISC | TAX, 0);
            a.op(LD | H | IND, 2);
            a.require(u32::from(flow.port));
        }
        IpAddr::V6(_) => {
            a.require(0x86dd);
            for (i, w) in (0u32..).zip(words(flow.destination)) {
                a.op(LD | W | IND, 24 + 4 * i);
                a.require(w);
            }
            if let Some(source) = flow.source {
                for (i, w) in (0u32..).zip(words(source)) {
                    a.op(LD | W | IND, 8 + 4 * i);
                    a.require(w);
                }
            }
            a.op(LD | B | IND, 6);
            a.jump(JMP | JEQ | K, 17, Target::Label(UDP6), Target::Next);
            // Extension headers (hop-by-hop, routing, fragment, AH,
            // destination options): the worker walks the chain.
            for ext in [0, 43, 44, 51] {
                a.jump(JMP | JEQ | K, ext, Target::Accept, Target::Next);
            }
            a.jump(JMP | JEQ | K, 60, Target::Accept, Target::Drop);
            a.label(UDP6);
            a.op(LD | H | IND, 42);
            a.require(u32::from(flow.port));
        }
    }
    // Falls through to accept.
    a.finish()
}

/// Loads at `SKF_NET_OFF + k` read the network header (linux/filter.h).
const SKF_NET_OFF: u32 = 0u32.wrapping_sub(0x0010_0000);

/// Bytes a UDP socket keeps of a datagram [`loop_guard`] marks as the
/// relay's own: the UDP header alone, so it arrives with no payload.
pub const LOOP_KEEP_BYTES: u32 = 8;

/// Most endpoints one [`loop_guard`] checks (11 instructions each for
/// IPv6, within the kernel's 4096-instruction limit); the rest are left
/// out.
pub const LOOP_GUARD_MAX_ENDPOINTS: usize = 256;

/// The run-time loop guard a UDP ingress socket carries (issue 27): a
/// datagram whose source address and port are one of `own` — the local
/// addresses of the flow's egress sockets, so a datagram the relay itself
/// sent, come back through a routing loop — is cut to its UDP header and
/// arrives with no payload, where the worker counts it as `drop_loop`
/// instead of relaying it. A datagram that really has no payload is
/// dropped here (the kernel counts it with the socket's drops), so an
/// empty receive always means a loop. Everything else passes whole.
///
/// A UDP socket's filter sees the datagram from its UDP header (the source
/// port at offset 0, the length at 4) and the IP header through
/// `SKF_NET_OFF` (the IPv4 source at 12, the IPv6 source at 8). `v6`:
/// the socket's family; endpoints of the other family can't arrive on it
/// and are left out. Per datagram: 3 instructions, plus 2 per own port
/// that doesn't match and 2 or 8 more for one that does.
pub fn loop_guard(v6: bool, own: &[std::net::SocketAddr]) -> Vec<Instruction> {
    let mut a = Asm::default();
    let ours = own
        .iter()
        .filter(|e| e.is_ipv6() == v6 && e.port() != 0 && !e.ip().is_unspecified())
        .take(LOOP_GUARD_MAX_ENDPOINTS);
    for (i, e) in ours.enumerate() {
        a.op(LD | H | ABS, 0);
        a.jump(
            JMP | JEQ | K,
            u32::from(e.port()),
            Target::Next,
            Target::Label(i),
        );
        let source = if v6 { 8 } else { 12 };
        for (j, word) in (0u32..).zip(words(e.ip())) {
            a.op(LD | W | ABS, SKF_NET_OFF.wrapping_add(source + 4 * j));
            a.jump(JMP | JEQ | K, word, Target::Next, Target::Label(i));
        }
        a.op(RET | K, LOOP_KEEP_BYTES);
        a.label(i);
    }
    a.op(LD | H | ABS, 4);
    a.jump(JMP | JEQ | K, 8, Target::Drop, Target::Accept);
    a.finish()
}

/// What the kernel knows about a frame besides its bytes, for
/// [`interpret`].
#[cfg(test)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Meta {
    pub(crate) outgoing: bool,
}

/// Runs `program` on `frame` the way the kernel's classic BPF does (for
/// the instructions [`flow_filter`] uses); returns the bytes kept, 0 to
/// drop. A load past the end of the frame drops it, as in the kernel.
#[cfg(test)]
pub(crate) fn interpret(program: &[Instruction], frame: &[u8], meta: Meta) -> u32 {
    interpret_at(program, frame, &[], meta)
}

/// [`interpret`] on a UDP socket's view: `data` from the UDP header, and
/// `network` (the IP header) behind `SKF_NET_OFF` loads.
#[cfg(test)]
pub(crate) fn interpret_at(
    program: &[Instruction],
    frame: &[u8],
    network: &[u8],
    meta: Meta,
) -> u32 {
    let (mut a, mut x, mut pc) = (0u32, 0u32, 0usize);
    let load = |at: u32, size: usize| -> Option<u32> {
        let (bytes, at) = if at >= SKF_NET_OFF && at < SKF_NET_OFF.wrapping_add(0x1_0000) {
            (network, at - SKF_NET_OFF)
        } else {
            (frame, at)
        };
        let at = at as usize;
        let b = bytes.get(at..at.checked_add(size)?)?;
        Some(b.iter().fold(0u32, |v, &byte| (v << 8) | u32::from(byte)))
    };
    while let Some(i) = program.get(pc) {
        pc += 1;
        let size = match i.code & 0x18 {
            W => 4,
            H => 2,
            _ => 1,
        };
        match i.code & 0x07 {
            LD => {
                a = match i.code & 0xe0 {
                    ABS if i.k == SKF_AD_OFF.wrapping_add(SKF_AD_PKTTYPE) => {
                        if meta.outgoing {
                            PACKET_OUTGOING
                        } else {
                            0
                        }
                    }
                    ABS => match load(i.k, size) {
                        Some(v) => v,
                        None => return 0,
                    },
                    IND => match load(x.wrapping_add(i.k), size) {
                        Some(v) => v,
                        None => return 0,
                    },
                    _ => panic!("unsupported load {:#x}", i.code),
                }
            }
            LDX => x = i.k,
            ALU => {
                let operand = if i.code & X != 0 { x } else { i.k };
                a = match i.code & 0xf0 {
                    ADD => a.wrapping_add(operand),
                    AND => a & operand,
                    LSH => a << operand,
                    _ => panic!("unsupported alu {:#x}", i.code),
                }
            }
            JMP => {
                let taken = match i.code & 0xf0 {
                    JEQ => a == i.k,
                    JSET => a & i.k != 0,
                    _ => panic!("unsupported jump {:#x}", i.code),
                };
                pc += usize::from(if taken { i.jt } else { i.jf });
            }
            RET => return i.k,
            MISC => x = a,
            _ => panic!("unsupported class {:#x}", i.code),
        }
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::tests::{v4_flow, v6_flow};
    use crate::testframes::{fix_ipv4_checksum, ipv4_udp, ipv4_udp_with_options, ipv6_udp, vlan};

    /// What a UDP socket's filter sees of a datagram from `from` with
    /// `payload` bytes: (IP header, UDP header + payload).
    fn udp_view(from: std::net::SocketAddr, payload: usize) -> (Vec<u8>, Vec<u8>) {
        let ip = match from.ip() {
            IpAddr::V4(a) => {
                let mut h = vec![0x45u8; 20];
                h[12..16].copy_from_slice(&a.octets());
                h
            }
            IpAddr::V6(a) => {
                let mut h = vec![0x60u8; 40];
                h[8..24].copy_from_slice(&a.octets());
                h
            }
        };
        let mut udp = Vec::new();
        udp.extend_from_slice(&from.port().to_be_bytes());
        udp.extend_from_slice(&5000u16.to_be_bytes());
        udp.extend_from_slice(&u16::try_from(8 + payload).expect("small").to_be_bytes());
        udp.extend_from_slice(&[0, 0]);
        udp.resize(8 + payload, 0x47);
        (ip, udp)
    }

    #[test]
    fn the_relays_own_datagrams_arrive_empty_and_empty_ones_are_dropped() {
        let own: Vec<std::net::SocketAddr> = vec![
            "10.0.0.1:40000".parse().expect("addr"),
            "10.0.0.2:40001".parse().expect("addr"),
            "[fd00::1]:40002".parse().expect("addr"),
            "0.0.0.0:40003".parse().expect("addr"),
        ];
        let run = |v6: bool, from: &str, payload: usize| {
            let (ip, udp) = udp_view(from.parse().expect("addr"), payload);
            interpret_at(&loop_guard(v6, &own), &udp, &ip, Meta::default())
        };
        // Our own: cut to the UDP header.
        assert_eq!(run(false, "10.0.0.1:40000", 1316), LOOP_KEEP_BYTES);
        assert_eq!(run(false, "10.0.0.2:40001", 1316), LOOP_KEEP_BYTES);
        assert_eq!(run(true, "[fd00::1]:40002", 1316), LOOP_KEEP_BYTES);
        // Same port from another host, or another port from us: whole.
        assert_eq!(run(false, "10.0.0.9:40000", 1316), ACCEPT_BYTES);
        assert_eq!(run(false, "10.0.0.1:40001", 1316), ACCEPT_BYTES);
        assert_eq!(run(true, "[fd00::2]:40002", 1316), ACCEPT_BYTES);
        // An unbound endpoint (no address yet) matches nothing.
        assert_eq!(run(false, "10.0.0.7:40003", 100), ACCEPT_BYTES);
        // A datagram without payload is dropped, ours or not.
        assert_eq!(run(false, "10.0.0.9:1234", 0), 0);
        assert_eq!(run(false, "10.0.0.1:40000", 0), LOOP_KEEP_BYTES);
        // No endpoints: only the empty-datagram rule.
        let (ip, udp) = udp_view("10.0.0.1:40000".parse().expect("addr"), 10);
        assert_eq!(
            interpret_at(&loop_guard(false, &[]), &udp, &ip, Meta::default()),
            ACCEPT_BYTES
        );
    }

    #[test]
    fn the_loop_guard_fits_the_kernels_limit_and_its_jumps() {
        let many: Vec<std::net::SocketAddr> = (0..1000u16)
            .map(|i| std::net::SocketAddr::new("fd00::1".parse().expect("addr"), 10_000 + i))
            .collect();
        let p = loop_guard(true, &many);
        assert!(p.len() <= 4096, "{} instructions", p.len());
        assert_eq!(p.len(), LOOP_GUARD_MAX_ENDPOINTS * 11 + 2 + 2);
        // The last endpoint kept is still found.
        let last = many[LOOP_GUARD_MAX_ENDPOINTS - 1];
        let (ip, udp) = udp_view(last, 50);
        assert_eq!(
            interpret_at(&p, &udp, &ip, Meta::default()),
            LOOP_KEEP_BYTES
        );
    }

    fn passes(flow: &FlowMatch, frame: &[u8]) -> bool {
        interpret(&flow_filter(flow), frame, Meta::default()) > 0
    }

    #[test]
    fn the_flows_own_datagrams_pass() {
        let f = v4_flow();
        assert!(passes(&f, &ipv4_udp("10.0.0.1", "239.1.1.1", 5000, b"x")));
        assert!(passes(
            &f,
            &ipv4_udp_with_options("10.0.0.1", "239.1.1.1", 5000, b"x", 3)
        ));
        assert!(passes(
            &f,
            &vlan(
                &ipv4_udp("10.0.0.1", "239.1.1.1", 5000, b"x"),
                &[(0x8100, 7)]
            )
        ));
        let qinq = vlan(
            &ipv4_udp("10.0.0.1", "239.1.1.1", 5000, b"x"),
            &[(0x88a8, 1), (0x8100, 2)],
        );
        assert!(passes(&f, &qinq));
        let f6 = v6_flow();
        assert!(passes(
            &f6,
            &ipv6_udp("fd01::1", "ff3e::1:1", 5000, &[], b"x")
        ));
        assert!(passes(
            &f6,
            &vlan(
                &ipv6_udp("fd01::1", "ff3e::1:1", 5000, &[], b"x"),
                &[(0x8100, 9)]
            )
        ));
    }

    #[test]
    fn everything_else_is_dropped_in_the_kernel() {
        let f = v4_flow();
        assert!(
            !passes(&f, &ipv4_udp("10.0.0.1", "239.1.1.2", 5000, b"x")),
            "other group"
        );
        assert!(
            !passes(&f, &ipv4_udp("10.0.0.1", "239.1.1.1", 5001, b"x")),
            "other port"
        );
        assert!(
            !passes(&f, &ipv6_udp("fd01::1", "ff3e::1:1", 5000, &[], b"x")),
            "IPv6"
        );
        let mut tcp = ipv4_udp("10.0.0.1", "239.1.1.1", 5000, b"x");
        tcp[14 + 9] = 6;
        fix_ipv4_checksum(&mut tcp, 14);
        assert!(!passes(&f, &tcp), "TCP");
        assert!(!passes(&f, &[0u8; 10]), "runt");
        let three = vlan(
            &ipv4_udp("10.0.0.1", "239.1.1.1", 5000, b"x"),
            &[(0x88a8, 1), (0x8100, 2), (0x8100, 3)],
        );
        assert!(!passes(&f, &three), "three tags");
        let f6 = v6_flow();
        assert!(
            !passes(&f6, &ipv6_udp("fd01::1", "ff3e::1:2", 5000, &[], b"x")),
            "other group"
        );
        assert!(
            !passes(&f6, &ipv6_udp("fd01::1", "ff3e::1:1", 5001, &[], b"x")),
            "other port"
        );
    }

    #[test]
    fn own_frames_are_dropped() {
        let f = v4_flow();
        let frame = ipv4_udp("10.0.0.1", "239.1.1.1", 5000, b"x");
        let p = flow_filter(&f);
        let outgoing = Meta { outgoing: true };
        assert_eq!(interpret(&p, &frame, outgoing), 0);
        assert_eq!(interpret(&p, &frame, Meta::default()), ACCEPT_BYTES);
    }

    #[test]
    fn source_specific_flows_check_the_source() {
        let ssm = FlowMatch {
            source: Some("10.0.0.9".parse().unwrap()),
            ..v4_flow()
        };
        assert!(passes(&ssm, &ipv4_udp("10.0.0.9", "239.1.1.1", 5000, b"x")));
        assert!(!passes(
            &ssm,
            &ipv4_udp("10.0.0.8", "239.1.1.1", 5000, b"x")
        ));
        let ssm6 = FlowMatch {
            source: Some("fd01::9".parse().unwrap()),
            ..v6_flow()
        };
        assert!(passes(
            &ssm6,
            &ipv6_udp("fd01::9", "ff3e::1:1", 5000, &[], b"x")
        ));
        assert!(!passes(
            &ssm6,
            &ipv6_udp("fd01::8", "ff3e::1:1", 5000, &[], b"x")
        ));
    }

    #[test]
    fn fragments_and_extension_headers_reach_the_worker_to_be_counted() {
        let mut frag = ipv4_udp("10.0.0.1", "239.1.1.1", 5000, b"x");
        frag[14 + 6] = 0x00;
        frag[14 + 7] = 0x10; // offset 16: a later fragment, no UDP header
        fix_ipv4_checksum(&mut frag, 14);
        assert!(passes(&v4_flow(), &frag));
        let ext = ipv6_udp("fd01::1", "ff3e::1:1", 5000, &[(0, 8), (44, 8)], b"x");
        assert!(passes(&v6_flow(), &ext));
    }

    #[test]
    fn jumps_stay_inside_the_program() {
        for flow in [v4_flow(), v6_flow()] {
            let p = flow_filter(&flow);
            assert!(p.len() < 100);
            for (i, ins) in p.iter().enumerate() {
                if ins.code & 0x07 == JMP {
                    assert!(i + 1 + usize::from(ins.jt.max(ins.jf)) < p.len());
                }
            }
            assert_eq!(p.last().map(|i| i.code), Some(RET | K));
        }
    }
}
