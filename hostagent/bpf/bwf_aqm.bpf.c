// SPDX-License-Identifier: GPL-2.0
/*
 * bwf_aqm: early marking (ECN-capable) or dropping (the rest) of
 * work-conservation (WC, ToS 0x20) packets on a switch port, for kernels
 * without the red/pie qdiscs.
 *
 * A tc egress classifier (direct action) keeps a virtual queue per port: it
 * grows by every packet's length and drains at the port rate, so it follows
 * the port's real backlog (BG and WC together). A proportional-integral
 * controller (PIE's, RFC 8033, without its burst allowance) sets the
 * marking probability p every TUPDATE_NS from the virtual queue's delay:
 * p += alpha x (delay - target) + beta x (delay - previous delay), with
 * PIE's alpha = 0.125/s and beta = 1.25/s scaled down while p is small.
 * target is the delay of the midpoint of [min_bytes, max_bytes]; p never
 * exceeds max_p; above max_bytes a ramp to 1 at twice max_bytes takes over
 * when it is higher (see hit_ppb). BG packets are never touched.
 *
 * Why a controller: Eq. 7 of the BG/WC paper (additive increase A_l^2 / K^2)
 * gives shares in proportion to A_l only when congestion signals fall on
 * each flow independently, at a steady rate (throughput ~ sqrt(increase /
 * p)). Drop-tail drops, and RED's marks on a queue that swings through its
 * ramp within a few round trips, fall on every flow at once: synchronised
 * AIMD flows share in proportion to the increase itself (A_l^2). With RED
 * (instantaneous or averaged queue) a 4:2:1 A_l row came out 4.9:2.2:1 to
 * 6.7:2.6:1; p from a slow controller is near constant over a round trip.
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
#define TOS_WC 0x20
#define PPM 1000000ULL
#define PPB 1000000000LL
#define MAX_GAP_NS 100000000ULL	/* drain at most 100 ms at once */
#define TUPDATE_NS 16000000ULL	/* the controller's period (PIE: 15 ms) */
#define PI_ALPHA 125LL		/* ppb per us of delay error: 0.125 / s */
#define PI_BETA 1250LL		/* ppb per us of delay change: 1.25 / s */

struct aqm_port {
	struct bpf_spin_lock lock;
	__u64 rate_bps;		/* config: the port's rate */
	__u32 min_bytes;	/* config: with max_bytes, the target's queue (their midpoint) */
	__u32 max_bytes;	/* config: from twice this on, every WC packet is hit */
	__u32 max_p_ppm;	/* config: p's ceiling, per million */
	__u32 pad;
	__u64 vq_bytes;		/* state */
	__u64 last_ns;		/* state */
	__s64 p_ppb;		/* state: the marking probability, per 10^9 */
	__u64 delay_old_us;	/* state: the delay at the last update */
	__u64 update_ns;	/* state: when p was last updated */
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

/* PIE's scaling of the gains: small while p is small, so that p moves in
 * steps of its own size */
static __always_inline __s64 scaled(__s64 d, __s64 p)
{
	if (p < 1000)			/* < 10^-6 */
		return d >> 11;
	if (p < 10000)
		return d >> 9;
	if (p < 100000)
		return d >> 7;
	if (p < 1000000)		/* < 10^-3 */
		return d >> 5;
	if (p < 10000000)
		return d >> 3;
	if (p < 100000000)		/* < 10^-1 */
		return d >> 1;
	return d;
}

static __always_inline void pi_update(struct aqm_port *p, __u64 q)
{
	__s64 delay = q * 8000000ULL / p->rate_bps;	/* us */
	__s64 target = ((__u64)p->min_bytes + p->max_bytes) / 2 * 8000000ULL / p->rate_bps;
	__s64 old = p->delay_old_us, prob = p->p_ppb, maxp = (__s64)p->max_p_ppm * 1000;

	prob += scaled(PI_ALPHA * (delay - target) + PI_BETA * (delay - old), prob);
	if (delay == 0 && old == 0)
		prob -= prob >> 6;		/* idle: decay (PIE: x 0.98) */
	if (prob < 0)
		prob = 0;
	if (prob > maxp)
		prob = maxp;
	p->p_ppb = prob;
	p->delay_old_us = delay;
}

/* what a WC packet is hit with: the controller's p, and above max_bytes at
 * least a ramp to 1 at twice max_bytes (RED's gentle region): the brake
 * for bursts (slow start) the controller is too slow for -- without it a
 * FIFO of 1.5 x max_bytes dropped a fifth as many at its tail as were
 * dropped early */
static __always_inline __s64 hit_ppb(const struct aqm_port *p, __u64 q)
{
	__u64 hi = p->max_bytes;
	__s64 ramp;

	if (q <= hi)
		return p->p_ppb;
	if (q >= 2 * hi)
		return PPB;
	ramp = (__s64)((q - hi) * (__u64)PPB / hi);
	return ramp > p->p_ppb ? ramp : p->p_ppb;
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
	__u64 now, gap, drained, q, dice;
	int wc = 0, ect = 0, hit;

	p = bpf_map_lookup_elem(&bwf_aqm_ports, &key);
	if (!p || !p->rate_bps)
		return TC_ACT_OK;
	if ((void *)(eth + 1) <= data_end && eth->h_proto == bpf_htons(ETH_P_IP)) {
		ip = (void *)(eth + 1);
		if ((void *)(ip + 1) <= data_end && (ip->tos & 0xfc) == TOS_WC) {
			wc = 1;
			ect = (ip->tos & 3) != 0;
		}
	}
	now = bpf_ktime_get_ns();
	dice = bpf_get_prandom_u32() % PPB;	/* no helper calls under the lock */
	bpf_spin_lock(&p->lock);
	gap = now > p->last_ns ? now - p->last_ns : 0;
	if (gap > MAX_GAP_NS)
		gap = MAX_GAP_NS;
	drained = gap * p->rate_bps / 8000000000ULL;
	p->vq_bytes = p->vq_bytes > drained ? p->vq_bytes - drained : 0;
	p->last_ns = now;
	q = p->vq_bytes + skb->len;
	/* capped at 2 x max, where every WC packet is hit, so it drains as
	 * soon as arrivals fall below the port rate: packets the real FIFO
	 * drops at its tail are counted here too, and without the cap a
	 * slow-start burst ran it away for good -- every non-ECN-capable WC
	 * packet (retransmissions are never ECT) dropped, the WC subflows dead */
	if (q > 2 * (__u64)p->max_bytes)
		q = 2 * (__u64)p->max_bytes;
	if (now - p->update_ns >= TUPDATE_NS) {
		pi_update(p, q);
		p->update_ns = now;
	}
	hit = wc && (__s64)dice < hit_ppb(p, q);
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
