// SPDX-License-Identifier: GPL-2.0
/*
 * bwf_sockops: per-subflow congestion control for MPTCP connections.
 * The first subflow of an MPTCP connection is the bandwidth-guarantee (BG)
 * subflow: Reno. Every MP_JOIN subflow is work conservation (WC): bwf_wc.
 * Plain TCP sockets are left alone. Attached to a cgroup v2 directory; MPTCP
 * subflows inherit the cgroup of the socket that created them.
 *
 * Both subflows also get a datacenter RTO floor (RTO_MIN_US instead of
 * Linux's 200 ms): the subflows share one connection-level buffer, freed
 * only in data-sequence order, so a WC subflow sitting out a 200 ms
 * timeout (its windows are small: it lives on leftovers) stalls the BG
 * subflow behind it for as long -- a buffer sized by Eq. 1 for the RTT
 * does not cover a timeout.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>

char _license[] SEC("license") = "GPL";

#define SOL_TCP 6
#define TCP_CONGESTION 13
#define RTO_MIN_US 20000

SEC("sockops")
int bwf_sockops(struct bpf_sock_ops *skops)
{
	char wc[] = "bwf_wc";
	char bg[] = "reno";
	int rto_min = RTO_MIN_US;
	struct bpf_sock *sk;
	struct mptcp_sock *msk;

	if (skops->op != BPF_SOCK_OPS_TCP_CONNECT_CB && skops->op != BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB)
		return 1;
	sk = skops->sk;
	if (!sk)
		return 1;
	msk = bpf_skc_to_mptcp_sock(sk);
	if (!msk)
		return 1;
	if (msk->first != (struct sock *)sk)
		bpf_setsockopt(skops, SOL_TCP, TCP_CONGESTION, wc, sizeof(wc));
	else
		bpf_setsockopt(skops, SOL_TCP, TCP_CONGESTION, bg, sizeof(bg));
	bpf_setsockopt(skops, SOL_TCP, TCP_BPF_RTO_MIN, &rto_min, sizeof(rto_min));
	return 1;
}
