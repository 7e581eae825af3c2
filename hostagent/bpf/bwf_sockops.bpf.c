// SPDX-License-Identifier: GPL-2.0
/*
 * bwf_sockops: per-subflow congestion control for MPTCP connections.
 * The first subflow of an MPTCP connection is the bandwidth-guarantee (BG)
 * subflow: Reno. Every MP_JOIN subflow is work conservation (WC): bwf_wc.
 * Plain TCP sockets are left alone. Attached to a cgroup v2 directory; MPTCP
 * subflows inherit the cgroup of the socket that created them.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>

char _license[] SEC("license") = "GPL";

#define SOL_TCP 6
#define TCP_CONGESTION 13

SEC("sockops")
int bwf_sockops(struct bpf_sock_ops *skops)
{
	char wc[] = "bwf_wc";
	char bg[] = "reno";
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
	return 1;
}
