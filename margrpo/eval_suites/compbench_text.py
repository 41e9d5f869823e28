"""What T2I-CompBench's scoring reads from a prompt's words: noun phrases (the BLIP-VQA questions),
the two related objects of a spatial prompt, and a complex prompt without its adjectives.

The benchmark's scripts read these with spaCy's en_core_web_sm pipeline: noun chunks (less "top",
"the side", "the left", "the right"), the first and last NOUN of a simple spatial prompt, the nouns
next to the relation phrase of a complex one, and the prompt without ADJ tokens. `SpacyParser` does
the same where spaCy and a pipeline are installed (`parser=` a pipeline name or a local pipeline
directory). Where they are not, `RuleParser` is a documented substitute: it splits the prompt into
chunks at punctuation and at a fixed list of function words (conjunctions, prepositions, relation
and auxiliary words), takes each chunk as a noun phrase and its last word as the noun, and drops
adjectives from a fixed list of attribute words (colours, materials, shapes, sizes). On the
benchmark's templated prompts ("a green bench and a blue bowl", "a dog in front of a desk") it reads
what spaCy reads; on free sentences it is an approximation, and every table says which was used.
"""

from __future__ import annotations

import re

EXCLUDED_CHUNKS = ("top", "the side", "the left", "the right")
# the relation phrases around which a complex prompt's two objects are read
COMPLEX_RELATIONS = ("on top of", "on bottom of", "on the left", "on the right", "next to", "on side of", "near")
DETERMINERS = frozenset("a an the this that these those its his her their our my your some one two three four five six seven eight".split())
AUXILIARIES = frozenset("is are was were be been being has have had".split())
FUNCTION_WORDS = AUXILIARIES | frozenset(
    "and or but with without on in of at near next to behind by under over above below beside besides from into "
    "onto for while as that which who whose front top bottom left right side hidden there here it they them".split()
)
ATTRIBUTE_WORDS = frozenset(
    "red orange yellow green blue purple pink brown black white gray grey beige gold golden silver violet "
    "wooden wood metallic metal plastic glass leather fabric rubber fluffy furry soft hard smooth rough shiny "
    "round square rectangular circular oval triangular cubic cylindrical spherical conical pyramidal oblong "
    "teardrop big small large tiny tall short long little huge giant old new young warm cool cold hot calm "
    "bright dark sharp crisp choppy".split()
)


def words(text: str) -> list[str]:
    """Lowercased words (letters, digits, inner apostrophes and hyphens), punctuation dropped."""
    return re.findall(r"[a-z0-9]+(?:['-][a-z0-9]+)*", text.lower())


class RuleParser:
    """The substitute for spaCy (see the module docstring)."""

    name = "rules (substitute for spaCy en_core_web_sm)"
    official = False

    def chunks(self, prompt: str) -> list[list[str]]:
        """Runs of words between punctuation, function words and determiners (a determiner opens a run),
        each with a word that is not a determiner; after an auxiliary ("is reading a book") the words
        before the next determiner are taken for a verb and skipped."""
        out: list[list[str]] = []
        for piece in re.split(r"[,.;:!?()\"]", prompt):
            run: list[str] = []
            skipping = False
            for word in words(piece) + ["and"]:  # a trailing separator closes the last run
                if word in FUNCTION_WORDS or word in DETERMINERS:
                    if any(w not in DETERMINERS for w in run):
                        out.append(run)
                    run = [word] if word in DETERMINERS else []
                    skipping = (skipping or word in AUXILIARIES) and word not in DETERMINERS
                elif not skipping:
                    run.append(word)
        return out

    def noun_phrases(self, prompt: str) -> list[str]:
        return [" ".join(c) for c in self.chunks(prompt) if " ".join(c) not in EXCLUDED_CHUNKS]

    def spatial_pair(self, prompt: str) -> tuple[str, str] | None:
        """(first noun, last noun): the heads of the first and last chunks."""
        chunks = self.chunks(prompt)
        return (chunks[0][-1], chunks[-1][-1]) if chunks else None

    def complex_pair(self, prompt: str) -> tuple[str, str] | None:
        """The nouns before and after the first relation phrase, None when there is none."""
        text = " ".join(words(prompt))
        for relation in COMPLEX_RELATIONS:
            at = f" {text} ".find(f" {relation} ")
            if at >= 0:
                before, after = self.chunks(text[:at]), self.chunks(text[at + len(relation) :])
                if before and after:
                    return before[-1][-1], after[0][-1]
        return None

    def without_adjectives(self, prompt: str) -> str:
        return " ".join(w for w in words(prompt) if w not in ATTRIBUTE_WORDS)


class SpacyParser:
    """The scripts' reading with a spaCy pipeline (`model`: a name such as en_core_web_sm or a directory)."""

    official = True

    def __init__(self, model: str = "en_core_web_sm") -> None:
        import spacy

        self.nlp = spacy.load(model)
        self.name = f"spaCy {model}"

    def noun_phrases(self, prompt: str) -> list[str]:
        return [c.text for c in self.nlp(prompt).noun_chunks if c.text not in EXCLUDED_CHUNKS]

    def spatial_pair(self, prompt: str) -> tuple[str, str] | None:
        nouns = [t.text for t in self.nlp(prompt) if t.pos_ == "NOUN"]
        return (nouns[0], nouns[-1]) if nouns else None

    def complex_pair(self, prompt: str) -> tuple[str, str] | None:
        """Per relation phrase, the noun (or proper noun) nearest before it and the first noun after it
        (else a proper noun not followed by another); the pair when exactly two were found, else None."""
        doc = self.nlp(prompt)
        found = []
        for i in range(len(doc)):
            size = next((k for k in (3, 2, 1) if doc[i : i + k].text in COMPLEX_RELATIONS), 0)
            if not size:
                continue
            found += [doc[j].text for j in range(i - 1, -1, -1) if doc[j].pos_ in ("NOUN", "PROPN")][:1]
            after = [doc[j].text for j in range(i + size, len(doc)) if doc[j].pos_ == "NOUN"][:1]
            found += (
                after or [doc[j].text for j in range(i + size, len(doc) - 1) if doc[j].pos_ == "PROPN" and doc[j + 1].pos_ != "PROPN"][:1]
            )
        return (found[0], found[1]) if len(found) == 2 else None

    def without_adjectives(self, prompt: str) -> str:
        return " ".join(t.text for t in self.nlp(prompt) if t.pos_ != "ADJ")


def build_parser(parser: str | None = None):
    """SpacyParser(parser or en_core_web_sm) when spaCy and that pipeline load; RuleParser when no
    pipeline was named and none loads, or when parser='rules'. A named pipeline that does not load is
    an error."""
    if parser == "rules":
        return RuleParser()
    try:
        return SpacyParser(parser or "en_core_web_sm")
    except (ImportError, OSError) as err:
        if parser is None:
            return RuleParser()
        raise ValueError(
            f"--spacy: cannot load the spaCy pipeline {parser!r} ({type(err).__name__}: {err}); "
            "install spaCy and the pipeline (python -m spacy download en_core_web_sm) or give its "
            "directory, or --spacy rules for the rule-based substitute"
        ) from err
