"""A suffix automaton over token sequences, grown one token at a time, with occurrence counts:
the index behind the suffix drafter (:mod:`~specdec_kernels.decoding.suffix`).

The automaton of a sequence (Blumer et al. 1985) has one state per class of substrings that
end at the same set of positions, at most ``2n - 1`` states for ``n`` tokens, and is built
online in amortised constant time per token. Several documents share one automaton (the
generalized automaton: every document starts again from the root), so one structure answers
for a request's own context or for a memory of earlier outputs.

What the drafter asks of it:

- **The longest earlier match.** For the automaton's own text, the longest suffix that also
  ends earlier is the suffix link of the state of the whole text (:meth:`SuffixAutomaton.
  repeated_suffix`); for another sequence (a request's context against a memory),
  :class:`Matcher` tracks the longest suffix that occurs in the automaton, token by token.
- **Continuations with frequencies.** From the state of a matched string ``s``, the
  transition by ``c`` leads to the state of ``s + c``, whose count is the number of times
  ``s`` was followed by ``c``; walking transitions further gives longer continuations.

``count[v]`` is the number of end positions of ``v``'s strings (over all documents), kept
exact by adding each new position along the suffix-link path of the state it creates;
``last_end[v]`` is the most recent of them (an index into :attr:`SuffixAutomaton.tokens`).
The path is short in natural text; in a long run of one repeated token it grows with the run.
"""

from __future__ import annotations

import heapq

__all__ = ["Continuation", "Matcher", "SuffixAutomaton"]


class SuffixAutomaton:
    """Suffix automaton of one growing sequence, or of several documents.

    Attributes
    ----------
    tokens : list of int
        Every token added, documents one after the other.
    next : list of dict
        Per state, ``{token: state}`` transitions (state 0 is the empty string).
    link, length, count, last_end : list of int
        Per state: suffix link (``-1`` for the root), length of its longest string, number of
        end positions, most recent end position (``-1`` for the root).
    """

    def __init__(self):
        self.tokens: list = []
        self.next: list = [{}]
        self.link: list = [-1]
        self.length: list = [0]
        self.count: list = [0]
        self.last_end: list = [-1]
        self.last = 0

    def __len__(self) -> int:
        """Number of states."""
        return len(self.length)

    def start_document(self) -> None:
        """The next token starts a new document (no match runs across the boundary)."""
        self.last = 0

    def extend(self, tokens) -> None:
        """Append tokens to the current document."""
        for token in tokens:
            self.append(int(token))

    def _new_state(self, length: int, link: int, like: int | None = None) -> int:
        self.next.append(dict(self.next[like]) if like is not None else {})
        self.link.append(link)
        self.length.append(length)
        self.count.append(self.count[like] if like is not None else 0)
        self.last_end.append(self.last_end[like] if like is not None else -1)
        return len(self.length) - 1

    def _clone(self, p: int, q: int, token: int) -> int:
        """Split ``q``: a copy of it holding its strings up to ``length[p] + 1``."""
        clone = self._new_state(self.length[p] + 1, self.link[q], like=q)
        while p != -1 and self.next[p].get(token) == q:
            self.next[p][token] = clone
            p = self.link[p]
        self.link[q] = clone
        return clone

    def append(self, token: int) -> None:
        """Append one token to the current document."""
        position = len(self.tokens)
        self.tokens.append(token)
        last = self.last
        known = self.next[last].get(token)
        if known is not None:  # another document already went this way
            cur = known if self.length[known] == self.length[last] + 1 else self._clone(
                last, known, token)
        else:
            cur = self._new_state(self.length[last] + 1, 0)
            p = last
            while p != -1 and token not in self.next[p]:
                self.next[p][token] = cur
                p = self.link[p]
            if p != -1:
                q = self.next[p][token]
                self.link[cur] = q if self.length[p] + 1 == self.length[q] else self._clone(
                    p, q, token)
        self.last = cur
        state = cur  # the new end position belongs to cur and to its suffix-link path
        while state > 0:
            self.count[state] += 1
            self.last_end[state] = position
            state = self.link[state]

    def repeated_suffix(self) -> tuple:
        """``(state, length)`` of the longest suffix of the current document that also ends
        earlier (``(0, 0)`` when none does)."""
        state = self.link[self.last] if self.last > 0 else 0
        return state, self.length[state] if state > 0 else 0

    def walk(self, tokens, state: int = 0) -> int | None:
        """The state reached from ``state`` by ``tokens`` (``None``: no such substring)."""
        for token in tokens:
            state = self.next[state].get(token)
            if state is None:
                return None
        return state

    def continuations(self, state: int, max_nodes: int, max_depth: int,
                      max_branches: int = 4, min_probability: float = 0.0) -> "Continuation":
        """The likeliest continuations of ``state``'s strings, as a tree.

        A child's probability is its share of its siblings' counts (the times the parent's
        string was followed by it, over all its followers); nodes are taken by path
        probability, most likely first, so the result is a tree.

        Parameters
        ----------
        state : int
            A matched state (not the root: its followers are every token).
        max_nodes, max_depth : int
            Most nodes and deepest node (the root, ``state`` itself, excluded).
        max_branches : int
            Most children looked at per node (the most frequent).
        min_probability : float
            Nodes whose path probability is below it are left out.
        """
        out = Continuation()
        frontier: list = []
        tie = 0

        def push(parent: int, node_state: int, prob: float, depth: int) -> None:
            nonlocal tie
            children = self.next[node_state]
            if depth >= max_depth or not children:
                return
            ranked = heapq.nsmallest(
                max_branches, children.items(), key=lambda item: (-self.count[item[1]], item[0])
            )
            total = sum(self.count[s] for s in children.values())
            for rank, (token, child) in enumerate(ranked):
                p = prob * self.count[child] / total
                if p >= min_probability:
                    heapq.heappush(frontier, (-p, tie, parent, token, child, rank, depth + 1))
                    tie += 1

        push(-1, state, 1.0, 0)
        while frontier and len(out) < max_nodes:
            neg, _, parent, token, child, rank, depth = heapq.heappop(frontier)
            node = out.add(parent, token, child, rank, depth, -neg)
            push(node, child, -neg, depth)
        return out


class Continuation:
    """A tree of continuations (see :meth:`SuffixAutomaton.continuations`); node ``i``'s
    parent is ``parents[i]`` (``-1``: a child of the matched string), parents first."""

    def __init__(self):
        self.parents: list = []
        self.tokens: list = []
        self.states: list = []
        self.ranks: list = []
        self.depths: list = []
        self.probs: list = []

    def __len__(self) -> int:
        return len(self.tokens)

    def add(self, parent, token, state, rank, depth, prob) -> int:
        self.parents.append(parent)
        self.tokens.append(token)
        self.states.append(state)
        self.ranks.append(rank)
        self.depths.append(depth)
        self.probs.append(prob)
        return len(self.tokens) - 1


class Matcher:
    """The longest suffix of a growing sequence that occurs in an automaton (matching
    statistics), updated one token at a time. The automaton must not grow meanwhile.

    Attributes
    ----------
    state, length : int
        The matched suffix's state and length (``0, 0``: nothing matches).
    """

    def __init__(self, automaton: SuffixAutomaton, tokens=()):
        self.automaton = automaton
        self.state, self.length = 0, 0
        self.extend(tokens)

    def extend(self, tokens) -> None:
        sam = self.automaton
        state, length = self.state, self.length
        for token in tokens:
            while state > 0 and token not in sam.next[state]:
                state = sam.link[state]
                length = sam.length[state]
            nxt = sam.next[state].get(token)
            if nxt is None:
                state, length = 0, 0
            else:
                state, length = nxt, length + 1
        self.state, self.length = state, length
