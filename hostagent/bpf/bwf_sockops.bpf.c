// SPDX-License-Identifier: GPL-2.0
/*
 * bwf_sockops: per-subflow settings for MPTCP connections.
 *
 * The first subflow of an MPTCP connection is the bandwidth-guarantee (BG)
 * subflow: Reno. Every MP_JOIN subflow is work conservation (WC): bwf_wc,
 * and a send buffer that follows its window: 2 x cwnd x (MSS + 1 KiB),
 * about what TCP's own autotuning gives a window (the KiB is a packet's
 * buffer overhead: send buffers count memory, not payload), at least
 * 2 x WC_SNDBUF_MIN, set again at every RTT sample. MPTCP's scheduler hands a
 * subflow data while its send buffer has room; with the namespace's large
 * initial buffer (Eq. 1's B) it parked 0.4-3 MB on a WC subflow draining at
 * a few Mb/s, and the connection's in-order delivery -- BG's data included
 * -- then waited seconds for WC. Sized to its window, WC holds about two of
 * its round trips of data; the rest waits at the connection level for
 * whichever subflow has room.
 *
 * Plain TCP sockets are left alone. Attached to a cgroup v2 directory; MPTCP
 * subflows inherit the cgroup of the socket that created them.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>

char _license[] SEC("license") = "GPL";

#define SOL_SOCKET 1
#define SO_SNDBUF 7
#define SOL_TCP 6
#define TCP_CONGESTION 13
#define WC_SNDBUF_MIN (32 * 1024)	/* the kernel doubles it: 64 KiB */

static __always_inline int is_join(struct bpf_sock_ops *skops)
{
	struct bpf_sock *sk = skops->sk;
	struct mptcp_sock *msk;

	if (!sk)
		return -1;
	msk = bpf_skc_to_mptcp_sock(sk);
	if (!msk)
		return -1;		/* not an MPTCP subflow */
	return msk->first != (struct sock *)sk;
}

static __always_inline void size_wc_sndbuf(struct bpf_sock_ops *skops)
{
	int val = skops->snd_cwnd * (skops->mss_cache + 1024);	/* x2 by the kernel */

	if (val < WC_SNDBUF_MIN)
		val = WC_SNDBUF_MIN;
	bpf_setsockopt(skops, SOL_SOCKET, SO_SNDBUF, &val, sizeof(val));
}

SEC("sockops")
int bwf_sockops(struct bpf_sock_ops *skops)
{
	char wc[] = "bwf_wc";
	char bg[] = "reno";
	int join;

	switch (skops->op) {
	case BPF_SOCK_OPS_TCP_CONNECT_CB:
	case BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB:
		join = is_join(skops);
		if (join < 0)
			return 1;
		if (join) {
			bpf_setsockopt(skops, SOL_TCP, TCP_CONGESTION, wc, sizeof(wc));
			bpf_sock_ops_cb_flags_set(skops, skops->bpf_sock_ops_cb_flags | BPF_SOCK_OPS_RTT_CB_FLAG);
		} else {
			bpf_setsockopt(skops, SOL_TCP, TCP_CONGESTION, bg, sizeof(bg));
		}
		return 1;
	case BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB:
		if (is_join(skops) == 1)
			size_wc_sndbuf(skops);
		return 1;
	case BPF_SOCK_OPS_RTT_CB:	/* enabled on joins only (above): no lookup per ACK */
		size_wc_sndbuf(skops);
		return 1;
	}
	return 1;
}
