"""Communication fail-slow: the link (IB/RoCE port or network interface) that makes a job's collectives slow
while every GPU computes at full speed, judged against the job's other links and its own pace."""
