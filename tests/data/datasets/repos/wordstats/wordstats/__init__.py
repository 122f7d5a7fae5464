"""Word counts of a text."""


def count_words(text):
    counts = {}
    for word in text.split():
        counts[word] = counts.get(word, 0) + 1
    return counts


def top(text, n):
    counts = count_words(text)
    return sorted(counts, key=lambda w: (-counts[w], w))[:n]
