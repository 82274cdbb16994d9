//! The one type for a flow's opened sockets, from where they are opened
//! ([`crate::open_flow`], in the helper or in the daemon itself when it
//! runs without privileges) over the helper connection to the daemon,
//! which hands them to the data plane: per leg its ingress socket and its
//! membership socket as named fields, then the outputs.
//!
//! On the connection they travel as one `SOCKETS` reply
//! ([`crate::protocol`]): [`OpenedFlow::header`] and [`OpenedFlow::fds`]
//! give its text and its fds in order, [`OpenedFlow::from_reply`] puts
//! them back together on the other side.

use std::net::UdpSocket;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use crate::protocol::{LegHeader, Reply};
use crate::udp::Ingress;

/// One leg's sockets: its ingress socket, the receive buffer the kernel
/// granted it, and for a packet leg on a group the socket holding its
/// membership.
pub type OpenedLeg = Ingress;

/// The sockets of one flow, as the configuration defines them.
#[derive(Debug)]
pub struct OpenedFlow {
    /// Per leg (input), in config order (one for a flow with `input`).
    pub legs: Vec<OpenedLeg>,
    /// One socket per output, in config order; connected, but for those
    /// in `unconnected`.
    pub outputs: Vec<UdpSocket>,
    /// Outputs whose source address or route is missing now (by index into
    /// `outputs`, with the errno): opened but not connected; the daemon
    /// retries the connection ([`crate::udp::connect_egress`]).
    pub unconnected: Vec<(usize, i32)>,
    /// The AF_XDP sockets of `egress = "xdp"` outputs, in output order
    /// (the outputs themselves keep their UDP socket in `outputs`). On the
    /// connection they follow the outputs' sockets, counted in the reply's
    /// header (`+x<n>`).
    pub xdp_outputs: Vec<crate::xdp::XdpEgressFds>,
}

impl OpenedFlow {
    /// The `SOCKETS` reply announcing these sockets.
    pub fn header(&self) -> Reply {
        Reply::Sockets {
            legs: self
                .legs
                .iter()
                .map(|l| LegHeader {
                    receive_buffer_bytes: l.receive_buffer_bytes,
                    membership: l.membership.is_some(),
                    xdp: l.xdp.is_some(),
                })
                .collect(),
            count: self.fds().len(),
            unconnected: self.unconnected.clone(),
            xdp_outputs: self.xdp_outputs.len(),
        }
    }

    /// Every fd, in the order the reply carries them: per leg its ingress
    /// then its membership socket, then the outputs.
    pub fn fds(&self) -> Vec<BorrowedFd<'_>> {
        self.legs
            .iter()
            .flat_map(|l| {
                std::iter::once(l.socket.as_fd())
                    .chain(l.membership.iter().map(AsFd::as_fd))
                    .chain(l.xdp.iter().flat_map(|x| [x.umem.as_fd(), x.link.as_fd()]))
            })
            .chain(self.outputs.iter().map(AsFd::as_fd))
            .chain(
                self.xdp_outputs
                    .iter()
                    .flat_map(|x| [x.socket.as_fd(), x.umem.as_fd()]),
            )
            .collect()
    }

    /// The `count` xdp outputs' fds, `None` when there aren't exactly
    /// that many (the daemon's configuration and the helper's disagree).
    pub fn take_xdp_outputs(&mut self, count: usize) -> Option<Vec<crate::xdp::XdpEgressFds>> {
        (self.xdp_outputs.len() == count).then(|| std::mem::take(&mut self.xdp_outputs))
    }

    /// The sockets of a `SOCKETS` reply (`legs`, `unconnected`) from its
    /// `fds`, in order. An error (what is wrong) when the fds don't match
    /// the legs, or an `unconnected` index names no output.
    pub fn from_reply(
        legs: &[LegHeader],
        fds: Vec<OwnedFd>,
        unconnected: Vec<(usize, i32)>,
        xdp_outputs: usize,
    ) -> Result<Self, String> {
        let mut fds = fds;
        let Some(xdp_from) = fds.len().checked_sub(2 * xdp_outputs) else {
            return Err(format!(
                "{} fds for {xdp_outputs} xdp outputs that need two each",
                fds.len()
            ));
        };
        let mut xdp_fds = fds.split_off(xdp_from).into_iter();
        let mut xdp = Vec::with_capacity(xdp_outputs);
        while let (Some(socket), Some(umem)) = (xdp_fds.next(), xdp_fds.next()) {
            xdp.push(crate::xdp::XdpEgressFds { socket, umem });
        }
        // No leg is fine: a flow whose inputs are all SRT (the daemon's
        // own); the daemon checks the count against its configuration.
        let leg_fds: usize = legs.iter().map(LegHeader::fds).sum();
        if fds.len() < leg_fds {
            return Err(format!(
                "{} fds for {} legs that need {leg_fds}",
                fds.len(),
                legs.len()
            ));
        }
        let mut fds = fds.into_iter();
        let mut opened = Vec::with_capacity(legs.len());
        for leg in legs {
            // Counted above: each `next` has an fd.
            let (Some(socket), membership) =
                (fds.next(), if leg.membership { fds.next() } else { None })
            else {
                return Err("fewer fds than the legs need".into());
            };
            let xdp = if leg.xdp {
                let (Some(umem), Some(link)) = (fds.next(), fds.next()) else {
                    return Err("fewer fds than the legs need".into());
                };
                Some(crate::xdp::XdpFds { umem, link })
            } else {
                None
            };
            opened.push(OpenedLeg {
                socket,
                receive_buffer_bytes: leg.receive_buffer_bytes,
                membership: membership.map(UdpSocket::from),
                xdp,
            });
        }
        let outputs: Vec<UdpSocket> = fds.map(UdpSocket::from).collect();
        if let Some(&(index, _)) = unconnected.iter().find(|(i, _)| *i >= outputs.len()) {
            return Err(format!(
                "unconnected output {index} of {} outputs",
                outputs.len()
            ));
        }
        Ok(OpenedFlow {
            legs: opened,
            outputs,
            unconnected,
            xdp_outputs: xdp,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn udp() -> UdpSocket {
        UdpSocket::bind("127.0.0.1:0").expect("bind")
    }

    fn port(fd: &OwnedFd) -> u16 {
        socket2::SockRef::from(fd)
            .local_addr()
            .ok()
            .and_then(|a| a.as_socket())
            .map_or(0, |a| a.port())
    }

    #[test]
    fn legs_and_memberships_travel_as_named_fields() {
        let flow = OpenedFlow {
            legs: vec![
                OpenedLeg {
                    socket: udp().into(),
                    receive_buffer_bytes: 100,
                    membership: None,
                    xdp: None,
                },
                OpenedLeg {
                    socket: udp().into(),
                    receive_buffer_bytes: 200,
                    membership: Some(udp()),
                    xdp: None,
                },
            ],
            outputs: vec![udp(), udp()],
            unconnected: vec![(1, 101)],
            xdp_outputs: Vec::new(),
        };
        let Reply::Sockets {
            legs,
            count,
            unconnected,
            ..
        } = flow.header()
        else {
            panic!("not a SOCKETS reply");
        };
        assert_eq!(count, 5);
        assert_eq!(
            String::from_utf8(flow.header().encode()).expect("text"),
            "SOCKETS 100,200+m 5 1:101"
        );
        let ports: Vec<u16> = flow
            .fds()
            .iter()
            .map(|fd| port(&fd.try_clone_to_owned().expect("dup")))
            .collect();
        let fds: Vec<OwnedFd> = flow
            .fds()
            .iter()
            .map(|fd| fd.try_clone_to_owned().expect("dup"))
            .collect();
        let back = OpenedFlow::from_reply(&legs, fds, unconnected, 0).expect("valid");
        assert_eq!(back.legs.len(), 2);
        assert_eq!(port(&back.legs[0].socket), ports[0]);
        assert!(back.legs[0].membership.is_none());
        assert_eq!(port(&back.legs[1].socket), ports[1]);
        let membership = back.legs[1].membership.as_ref().expect("membership");
        assert_eq!(membership.local_addr().expect("addr").port(), ports[2]);
        assert_eq!(back.legs[1].receive_buffer_bytes, 200);
        let outs: Vec<u16> = back
            .outputs
            .iter()
            .map(|o| o.local_addr().expect("addr").port())
            .collect();
        assert_eq!(outs, ports[3..]);
        assert_eq!(back.unconnected, [(1, 101)]);
    }

    #[test]
    fn xdp_outputs_travel_after_the_outputs_and_are_taken_back() {
        let x = || crate::xdp::XdpEgressFds {
            socket: udp().into(),
            umem: udp().into(),
        };
        let mut flow = OpenedFlow {
            legs: vec![OpenedLeg {
                socket: udp().into(),
                receive_buffer_bytes: 100,
                membership: None,
                xdp: None,
            }],
            outputs: vec![udp(), udp()],
            unconnected: vec![],
            xdp_outputs: vec![x(), x()],
        };
        let Reply::Sockets {
            legs,
            count,
            xdp_outputs,
            ..
        } = flow.header()
        else {
            panic!("not a SOCKETS reply");
        };
        assert_eq!((count, xdp_outputs), (1 + 2 + 4, 2));
        assert_eq!(
            String::from_utf8(flow.header().encode()).expect("text"),
            "SOCKETS 100 7+x2"
        );
        let fds: Vec<OwnedFd> = flow
            .fds()
            .iter()
            .map(|fd| fd.try_clone_to_owned().expect("dup"))
            .collect();
        let ports: Vec<u16> = fds.iter().map(port).collect();
        let fds_short = || (0..7).map(|_| OwnedFd::from(udp())).collect::<Vec<_>>();
        assert!(OpenedFlow::from_reply(&legs, fds_short(), vec![], 4).is_err());
        let mut back = OpenedFlow::from_reply(&legs, fds, vec![], 2).expect("valid");
        assert!(back.take_xdp_outputs(4).is_none(), "only 2 are there");
        let taken = back.take_xdp_outputs(2).expect("two");
        assert_eq!(back.outputs.len(), 2);
        let got: Vec<u16> = taken
            .iter()
            .flat_map(|x| [port(&x.socket), port(&x.umem)])
            .collect();
        assert_eq!(got, ports[3..]);
        // Opened in this process: the field itself.
        assert_eq!(flow.take_xdp_outputs(2).expect("two").len(), 2);
        assert_eq!(flow.outputs.len(), 2);
    }

    #[test]
    fn mismatched_replies_are_errors() {
        let leg = |membership| LegHeader {
            receive_buffer_bytes: 1,
            membership,
            xdp: false,
        };
        let fds = |n: usize| (0..n).map(|_| OwnedFd::from(udp())).collect::<Vec<_>>();
        // No leg (a flow whose inputs are all SRT): its outputs only.
        let srt_only = OpenedFlow::from_reply(&[], fds(2), vec![], 0).expect("no leg");
        assert_eq!((srt_only.legs.len(), srt_only.outputs.len()), (0, 2));
        assert!(OpenedFlow::from_reply(&[leg(true), leg(false)], fds(2), vec![], 0).is_err());
        assert!(OpenedFlow::from_reply(&[leg(false)], fds(2), vec![(1, 5)], 0).is_err());
        let ok = OpenedFlow::from_reply(&[leg(false)], fds(2), vec![(0, 5)], 0).expect("ok");
        assert_eq!(ok.outputs.len(), 1);
        // An xdp leg takes its UMEM and link after its membership.
        let xdp = LegHeader {
            receive_buffer_bytes: 0,
            membership: true,
            xdp: true,
        };
        assert!(OpenedFlow::from_reply(&[xdp], fds(3), vec![], 0).is_err());
        let ok = OpenedFlow::from_reply(&[xdp], fds(5), vec![], 0).expect("ok");
        assert!(ok.legs[0].membership.is_some() && ok.legs[0].xdp.is_some());
        assert_eq!(ok.outputs.len(), 1);
        assert_eq!(ok.fds().len(), 5);
    }
}
