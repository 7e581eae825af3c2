// SPDX-License-Identifier: GPL-2.0
/*
 * bwf_aqm: random early drop of work-conservation (WC, ToS 0x20) packets on
 * a switch port, for kernels without the red qdisc.
 *
 * A tc egress classifier (direct action) keeps a virtual queue per port: it
 * grows by every packet's length and drains at the port rate, so it follows
 * the port's real backlog (BG and WC together). WC packets are dropped with
 * a probability that rises linearly from 0 at min_bytes to max_p at
 * max_bytes, then (gentle) to 1 at twice max_bytes. BG packets are never
 * dropped here. Why: with drop-tail, the WC flows sharing the low queue lose
 * packets together, and synchronised AIMD flows share in proportion to their
 * additive increase (A_l^2) instead of its square root (A_l, what Eq. 7 of
 * the BG/WC paper assumes: losses falling on flows at random).
 *
 * On the instantaneous queue, on purpose (measured, bgwc-table3/fig12): a
 * moving average over 32 ms, and a PIE-style proportional-integral
 * controller (a near-constant p), shared WC no closer to A_l (row 4:2:1
 * still 6:2.6:1 or so), and the controller lets slow-start bursts fill the
 * WC queue before p catches up (WC round trips to ~250 ms; one fig12 run
 * with it: BG 0.85 of its guarantee, 0.83-0.98 in five with this). Not
 * better, so the simpler one stays.
 *
 * A port with AQM_EVERY_CLASS treats every IPv4 packet of 128 bytes or more
 * so (ACKs never): a fabric without BG/WC classes.
 *
 * Ports are configured in bwf_aqm_ports (key: ifindex) by user space.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

char _license[] SEC("license") = "GPL";

#define TC_ACT_OK 0
#define TC_ACT_SHOT 2
#define ETH_P_IP 0x0800
/* the BG/WC contract (bwcommon/contract.py), passed by hostagent.cc.build */
#if !defined(TOS_WC) || !defined(TOS_MASK)
#error "build with -DTOS_WC=... -DTOS_MASK=... (hostagent.cc.build does)"
#endif
#define PPM 1000000ULL
#define MAX_GAP_NS 100000000ULL	/* drain at most 100 ms at once */
/* every IPv4 packet of ACK_MAX_BYTES or more meets the early drop, whatever
 * its class: a fabric without BG/WC classes (the routing comparisons), where
 * drop-tail losses fall on the flows with the fewest segments in flight */
#define AQM_EVERY_CLASS 1
#define ACK_MAX_BYTES 128	/* IP total length: shorter packets (ACKs) never dropped */

struct aqm_port {
	struct bpf_spin_lock lock;
	__u64 rate_bps;		/* config: the port's rate */
	__u32 min_bytes;	/* config */
	__u32 max_bytes;	/* config */
	__u32 max_p_ppm;	/* config: drop probability at max_bytes, per million */
	__u32 flags;		/* config: AQM_EVERY_CLASS */
	__u64 vq_bytes;		/* state */
	__u64 last_ns;		/* state */
	__u64 wc_seen;		/* counters */
	__u64 wc_dropped;
	__u64 wc_marked;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, struct aqm_port);
} bwf_aqm_ports SEC(".maps");

static __always_inline __u64 drop_ppm(const struct aqm_port *p, __u64 q)
{
	__u64 lo = p->min_bytes, hi = p->max_bytes, maxp = p->max_p_ppm;

	if (q <= lo || hi <= lo)
		return 0;
	if (q < hi)
		return maxp * (q - lo) / (hi - lo);
	if (q < 2 * hi)
		return maxp + (PPM - maxp) * (q - hi) / hi;
	return PPM;
}

SEC("tc")
int bwf_aqm(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip;
	struct aqm_port *p;
	__u32 key = skb->ifindex;
	__u64 now, gap, drained, q, ppm, dice;
	int wc = 0, ect = 0, hit;

	p = bpf_map_lookup_elem(&bwf_aqm_ports, &key);
	if (!p)
		return TC_ACT_OK;
	if ((void *)(eth + 1) <= data_end && eth->h_proto == bpf_htons(ETH_P_IP)) {
		ip = (void *)(eth + 1);
		if ((void *)(ip + 1) <= data_end &&
		    ((ip->tos & TOS_MASK) == TOS_WC ||
		     ((p->flags & AQM_EVERY_CLASS) && bpf_ntohs(ip->tot_len) >= ACK_MAX_BYTES))) {
			wc = 1;
			ect = (ip->tos & 3) != 0;
		}
	}
	now = bpf_ktime_get_ns();
	dice = bpf_get_prandom_u32() % PPM;	/* no helper calls under the lock */
	bpf_spin_lock(&p->lock);
	gap = now > p->last_ns ? now - p->last_ns : 0;
	if (gap > MAX_GAP_NS)
		gap = MAX_GAP_NS;
	drained = gap * p->rate_bps / 8000000000ULL;
	p->vq_bytes = p->vq_bytes > drained ? p->vq_bytes - drained : 0;
	p->last_ns = now;
	q = p->vq_bytes + skb->len;
	/* capped at 2 x max (where the gentle slope reaches 1), so it drains
	 * as soon as arrivals fall below the port rate: packets the real FIFO
	 * drops at its tail are counted here too, and without the cap a
	 * slow-start burst ran it away for good -- every non-ECN-capable WC
	 * packet (retransmissions are never ECT) dropped, the WC subflows dead */
	if (q > 2 * (__u64)p->max_bytes)
		q = 2 * (__u64)p->max_bytes;
	ppm = wc ? drop_ppm(p, q) : 0;
	hit = dice < ppm;
	if (hit && !ect) {
		p->wc_dropped++;
		p->wc_seen++;
		bpf_spin_unlock(&p->lock);
		return TC_ACT_SHOT;
	}
	p->vq_bytes = q;
	if (wc)
		p->wc_seen++;
	if (hit)
		p->wc_marked++;
	bpf_spin_unlock(&p->lock);
	if (hit)
		bpf_skb_ecn_set_ce(skb);	/* ECT -> CE, checksum fixed by the helper */
	return TC_ACT_OK;
}
