"""Closed intervals [start, end] on the integers."""


def merge(intervals):
    out = []
    for start, end in sorted(intervals):
        if out and start < out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def covers(intervals, point):
    return any(start <= point < end for start, end in merge(intervals))
