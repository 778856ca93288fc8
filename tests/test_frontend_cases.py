"""What a listener expects to hear: a table of written English -> the words the English
frontend hands to the model (normalize_text), and where split_sentences cuts.

Conventions of the frontend, kept across the table: cardinals without hyphens ("twenty four"),
compound ordinals with one ("twenty-first"), abbreviations expanded in lower case ("doctor",
"saint"), letter abbreviations as one capitalised word ("US", "PM": espeak spells them),
digits of phone numbers one by one with a comma (a short pause) between groups.
The first rows are the failures reported in issue 29.
"""

from __future__ import annotations

import pytest

from onnx_tts.frontend import normalize_text, split_sentences

ISSUE_29 = [
    ("Call 555-1234.", "Call five five five, one two three four."),
    ("We're open 24/7.", "We're open twenty four seven."),
    ("Music from the '90s.", "Music from the nineties."),
    ("Main St. is closed.", "Main street is closed."),
    ("She moved to the U.S. last year.", "She moved to the US last year."),
    ("The show starts at 8 p.m. sharp.", "The show starts at eight PM sharp."),
]

PHONES = [
    ("555-1234", "five five five, one two three four"),
    ("(555) 123-4567", "five five five, one two three, four five six seven"),
    ("(555)123-4567", "five five five, one two three, four five six seven"),
    ("555-123-4567", "five five five, one two three, four five six seven"),
    ("555.123.4567", "five five five, one two three, four five six seven"),
    ("+1 555 123 4567", "plus one, five five five, one two three, four five six seven"),
    ("+1-555-123-4567", "plus one, five five five, one two three, four five six seven"),
    ("+44 20 7946 0958", "plus four four, two zero, seven nine four six, zero nine five eight"),
    ("+1 (555) 123-4567", "plus one, five five five, one two three, four five six seven"),
    ("1-800-555-1234", "one, eight zero zero, five five five, one two three four"),
    ("Call 555-1234 now.", "Call five five five, one two three four now."),
    ("Fax: 555-987-6543.", "Fax: five five five, nine eight seven, six five four three."),
    ("call 5551234567", "call five five five one two three four five six seven"),
    ("Dial 911.", "Dial nine one one."),
    ("call 411 now", "call four one one now"),
]

RATIOS_AND_FRACTIONS = [
    ("24/7", "twenty four seven"),
    ("50/50", "fifty fifty"),
    ("9/11", "nine eleven"),
    ("1/2", "one half"),
    ("1/2 cup", "one half cup"),
    ("3/4", "three quarters"),
    ("1/4 mile", "one quarter mile"),
    ("2/3 of them", "two thirds of them"),
    ("1/3", "one third"),
    ("5/8 inch", "five eighths inch"),
    ("7/10", "seven tenths"),
    ("1/100", "one one hundredth"),
    ("3/16", "three sixteenths"),
    ("2 1/2 cups", "two and a half cups"),
    ("1 3/4 miles", "one and three quarters miles"),
    ("½ cup", "one half cup"),
    ("¾ full", "three quarters full"),
    ("4/5 of the votes", "four fifths of the votes"),
    ("a 3/2 split", "a three two split"),
    ("and/or", "and or"),
]

DECADES = [
    ("the '90s", "the nineties"),
    ("the ’80s", "the eighties"),
    ("in the 90s", "in the nineties"),
    ("the early 2000s", "the early two thousands"),
    ("the 1990s", "the nineteen nineties"),
    ("the 1960's", "the nineteen sixties"),
    ("the 1800s", "the eighteen hundreds"),
    ("the 2010s", "the twenty tens"),
    ("the mid-90s", "the mid nineties"),
    ("her 20s", "her twenties"),
    ("late '70s rock", "late seventies rock"),
    ("the '20s", "the twenties"),
    ("wait 30s", "wait thirty seconds"),
]

SAINT_OR_STREET = [
    ("St. Louis", "saint Louis"),
    ("Visit St. Louis today.", "Visit saint Louis today."),
    ("He flew to St. Petersburg.", "He flew to saint Petersburg."),
    ("St. Patrick's Day", "saint Patrick's Day"),
    ("Main St.", "Main street."),
    ("123 Main St.", "one hundred twenty three Main street."),
    ("Turn onto Main St. and park.", "Turn onto Main street and park."),
    ("I live on Elm St. The house is blue.", "I live on Elm street. The house is blue."),
    ("5th St. is busy.", "fifth street is busy."),
    ("Dr. Smith is here.", "doctor Smith is here."),
    ("I saw Dr. Jones.", "I saw doctor Jones."),
    ("Elm Dr. is closed.", "Elm drive is closed."),
    ("She lives at 4 Oak Dr.", "She lives at four Oak drive."),
    ("Mt. Everest", "mount Everest"),
    ("Ft. Worth", "fort Worth"),
    ("Park Ave.", "Park avenue."),
    ("Sunset Blvd. at night", "Sunset boulevard at night"),
]

ABBREVIATIONS = [
    ("Mr. Smith", "mister Smith"),
    ("Mrs. Smith", "missus Smith"),
    ("Ms. Lee", "miss Lee"),
    ("Prof. Chen", "professor Chen"),
    ("Mr. and Mrs. Smith", "mister and missus Smith"),
    ("e.g. apples", "for example apples"),
    ("fruit, e.g., apples", "fruit, for example, apples"),
    ("i.e. never", "that is never"),
    ("cats vs. dogs", "cats versus dogs"),
    ("cats vs dogs", "cats versus dogs"),
    ("apples, pears, etc.", "apples, pears, et cetera."),
    ("apples, etc. are good", "apples, et cetera are good"),
    ("Acme Inc.", "Acme incorporated."),
    ("Acme Ltd. sells tools", "Acme limited sells tools"),
    ("Martin Luther King Jr. spoke", "Martin Luther King junior spoke"),
    ("approx. ten", "approximately ten"),
    ("the U.S. Army", "the US Army"),
    ("the U.K. and France", "the UK and France"),
    ("Washington, D.C.", "Washington, DC."),
    ("the U.S.A.", "the USA."),
    ("No. 5", "number five"),
    ("#1 fan", "number one fan"),
    ("John F. Kennedy", "John F Kennedy"),
    ("J. R. R. Tolkien wrote it.", "J R R Tolkien wrote it."),
    ("No. I won't.", "No. I won't."),
    # Lower-case words that are also abbreviations when capitalised stay words.
    ("I ate a fig.", "I ate a fig."),
    ("Next gen.", "Next gen."),
    ("VS Code", "VS Code"),
]

# (text, the chunks split_sentences gives after normalisation)
SENTENCES = [
    (
        "I live in the U.S. and I like it.",
        ["I live in the US and I like it."],
    ),
    (
        "I live in the U.S. The weather is nice.",
        ["I live in the US.", "The weather is nice."],
    ),
    (
        "It ends at 5 p.m. tomorrow.",
        ["It ends at five PM tomorrow."],
    ),
    (
        "It ended at 5 p.m. We went home.",
        ["It ended at five PM.", "We went home."],
    ),
    (
        "We met at 10:30 a.m. It was early.",
        ["We met at ten thirty AM.", "It was early."],
    ),
    (
        "Dr. Smith arrived. Mr. Jones left.",
        ["doctor Smith arrived.", "mister Jones left."],
    ),
    (
        "Bring fruit, e.g. apples. Then go.",
        ["Bring fruit, for example apples.", "Then go."],
    ),
    (
        "Pens, paper, etc. The rest is yours.",
        ["Pens, paper, et cetera.", "The rest is yours."],
    ),
    (
        "Acme Inc. This company makes tools.",
        ["Acme incorporated.", "This company makes tools."],
    ),
    (
        "He went to St. Louis. It rained.",
        ["He went to saint Louis.", "It rained."],
    ),
    (
        "Turn onto Main St. Then stop.",
        ["Turn onto Main street.", "Then stop."],
    ),
    (
        "John F. Kennedy spoke. Everyone listened.",
        ["John F Kennedy spoke.", "Everyone listened."],
    ),
    (
        "The U.S. Navy sailed. The U.K. Navy followed.",
        ["The US Navy sailed.", "The UK Navy followed."],
    ),
    (
        "It took 5 min. Then we left.",
        ["It took five minutes.", "Then we left."],
    ),
    (
        "Is it 3.5 or 4? Nobody knows!",
        ["Is it three point five or four?", "Nobody knows!"],
    ),
    (
        "Prices rose 5% in the U.S. Then markets fell.",
        ["Prices rose five percent in the US.", "Then markets fell."],
    ),
]

MONEY = [
    ("$5", "five dollars"),
    ("$1", "one dollar"),
    ("$5.99", "five dollars and ninety nine cents"),
    ("$1.01", "one dollar and one cent"),
    ("$0.99", "ninety nine cents"),
    ("$0.01", "one cent"),
    ("$1.00", "one dollar"),
    ("$1,250", "one thousand two hundred fifty dollars"),
    ("$5M", "five million dollars"),
    ("$5m", "five million dollars"),
    ("$2.5B", "two point five billion dollars"),
    ("$3bn", "three billion dollars"),
    ("$10k", "ten thousand dollars"),
    ("$1.5 million", "one point five million dollars"),
    ("$2 billion", "two billion dollars"),
    ("€3.50", "three euros and fifty cents"),
    ("€1", "one euro"),
    ("€20M", "twenty million euros"),
    ("£1", "one pound"),
    ("£3.50", "three pounds and fifty pence"),
    ("£0.01", "one penny"),
    ("¥500", "five hundred yen"),
    ("5€", "five euros"),
    ("10 €", "ten euros"),
    ("99¢", "ninety nine cents"),
    ("-$5", "minus five dollars"),
    ("$1 and £3.50", "one dollar and three pounds and fifty pence"),
    ("It costs $12.", "It costs twelve dollars."),
    ("$1.234", "one point two three four dollars"),
]

TIMES = [
    ("3:30 pm", "three thirty PM"),
    ("3:30 PM", "three thirty PM"),
    ("3:30 p.m.", "three thirty PM."),
    ("3:30pm", "three thirty PM"),
    ("15:45", "fifteen forty five"),
    ("at 10:30", "at ten thirty"),
    ("10:05 am", "ten oh five AM"),
    ("9:00", "nine o'clock"),
    ("9:00 am", "nine AM"),
    ("15:00", "fifteen hundred"),
    ("3 pm", "three PM"),
    ("3pm", "three PM"),
    ("3 p.m. today", "three PM today"),
    ("11 a.m. sharp", "eleven AM sharp"),
    ("12 pm", "twelve PM"),
    ("7 AM", "seven AM"),
    ("at 6:07 in the morning", "at six oh seven in the morning"),
    ("23:59", "twenty three fifty nine"),
    ("0:30", "zero thirty"),
]

ORDINALS = [
    ("1st", "first"),
    ("2nd", "second"),
    ("3rd", "third"),
    ("4th", "fourth"),
    ("11th", "eleventh"),
    ("12th", "twelfth"),
    ("13th", "thirteenth"),
    ("21st", "twenty-first"),
    ("22nd", "twenty-second"),
    ("33rd", "thirty-third"),
    ("100th", "one hundredth"),
    ("101st", "one hundred first"),
    ("111th", "one hundred eleventh"),
    ("the 20th century", "the twentieth century"),
    ("on the 5th floor", "on the fifth floor"),
    ("my 40th birthday", "my fortieth birthday"),
]

UNITS = [
    ("5 km", "five kilometers"),
    ("1 km", "one kilometer"),
    ("5km", "five kilometers"),
    ("2.5 kg", "two point five kilograms"),
    ("1 kg", "one kilogram"),
    ("50%", "fifty percent"),
    ("5.5%", "five point five percent"),
    ("100%", "one hundred percent"),
    ("20°C", "twenty degrees Celsius"),
    ("-5°C", "minus five degrees Celsius"),
    ("1°C", "one degree Celsius"),
    ("70°F", "seventy degrees Fahrenheit"),
    ("90°", "ninety degrees"),
    ("60 mph", "sixty miles per hour"),
    ("100 km/h", "one hundred kilometers per hour"),
    ("10 m/s", "ten meters per second"),
    ("3 GB", "three gigabytes"),
    ("512 MB", "five hundred twelve megabytes"),
    ("2 TB", "two terabytes"),
    ("5 ms", "five milliseconds"),
    ("30 min", "thirty minutes"),
    ("2 h", "two hours"),
    ("50 Hz", "fifty hertz"),
    ("2.4 GHz", "two point four gigahertz"),
    ("500 mg", "five hundred milligrams"),
    ("250 ml", "two hundred fifty milliliters"),
    ("6 ft", "six feet"),
    ("1 ft", "one foot"),
    ("10 lbs", "ten pounds"),
    ("1 lb", "one pound"),
    ("8 oz", "eight ounces"),
    ("26.2 mi", "twenty six point two miles"),
    ("100 yd", "one hundred yards"),
    ("5 kW", "five kilowatts"),
    ("3 kWh", "three kilowatt hours"),
    ("15 cm", "fifteen centimeters"),
    ("3 mm", "three millimeters"),
    ("100 m", "one hundred meters"),
    ("He is 6 ft. tall", "He is six feet tall"),
    ("5 min. later", "five minutes later"),
    ("$5/month", "five dollars per month"),
    ("20 km/day", "twenty kilometers per day"),
]

YEARS_AND_NUMBERS = [
    ("in 1984", "in nineteen eighty four"),
    ("in 2024", "in twenty twenty four"),
    ("since 1999", "since nineteen ninety nine"),
    ("by 2030", "by twenty thirty"),
    ("in 2005", "in two thousand five"),
    ("in 1905", "in nineteen oh five"),
    ("in 1900", "in nineteen hundred"),
    ("in 2000", "in two thousand"),
    ("1999 was a good year.", "nineteen ninety nine was a good year."),
    ("the 2024 election", "the twenty twenty four election"),
    ("summer of 1969", "summer of nineteen sixty nine"),
    ("born in 1990.", "born in nineteen ninety."),
    ("500 BC", "five hundred BC"),
    ("1066 AD", "ten sixty six AD"),
    ("There were 2024 people.", "There were two thousand twenty four people."),
    ("He ran 1500 meters", "He ran one thousand five hundred meters"),
    ("We sold 1999 copies", "We sold one thousand nine hundred ninety nine copies"),
    ("1,984 votes", "one thousand nine hundred eighty four votes"),
    ("42", "forty two"),
    ("0", "zero"),
    ("7", "seven"),
    ("13", "thirteen"),
    ("100", "one hundred"),
    ("101", "one hundred one"),
    ("1000", "one thousand"),
    ("1,000,000", "one million"),
    ("3.14", "three point one four"),
    ("0.5", "zero point five"),
    ("-5", "minus five"),
    ("agent 007", "agent zero zero seven"),
    ("items 2,3", "items two, three"),
    ("1.2.3.4", "one point two point three point four"),
    ("version 10.0.1.", "version ten point zero point one."),
    ("3.14e10", "three point one four times ten to the power of ten"),
]

DATES_AND_RANGES = [
    ("March 3", "March third"),
    ("March 3, 2024", "March third, twenty twenty four"),
    ("on May 5", "on May fifth"),
    ("Jan. 1", "January first"),
    ("Dec 25", "December twenty-fifth"),
    ("Sept. 11, 2001", "September eleventh, two thousand one"),
    ("July 4th", "July fourth"),
    ("2024-01-15", "January fifteenth, twenty twenty four"),
    ("12/25/2024", "December twenty-fifth, twenty twenty four"),
    ("1/2/24", "January second, twenty four"),
    ("pages 10-20", "pages ten to twenty"),
    ("1990-1995", "nineteen ninety to nineteen ninety five"),
    ("ages 5-12", "ages five to twelve"),
    ("won 3-2", "won three to two"),
    ("a 5-year-old", "a five-year-old"),
]

SYMBOLS_AND_TEXT = [
    ("Tom & Jerry", "Tom and Jerry"),
    ("a+b", "a plus b"),
    ("me@home", "me at home"),
    ("2 + 2 = 4", "two plus two equals four"),
    ("It’s  3.5\tpercent…", "It's three point five percent..."),
    ("Hello, world!", "Hello, world!"),
    ("Room 42", "Room forty two"),
    (
        "Dr. Smith paid $1,250 & left.",
        "doctor Smith paid one thousand two hundred fifty dollars and left.",
    ),
    ("Déjà vu, naïve café.", "Déjà vu, naïve café."),
]

CASES = [
    *ISSUE_29,
    *PHONES,
    *RATIOS_AND_FRACTIONS,
    *DECADES,
    *SAINT_OR_STREET,
    *ABBREVIATIONS,
    *MONEY,
    *TIMES,
    *ORDINALS,
    *UNITS,
    *YEARS_AND_NUMBERS,
    *DATES_AND_RANGES,
    *SYMBOLS_AND_TEXT,
]


def test_the_table_is_large_and_has_no_duplicates() -> None:
    texts = [text for text, _ in CASES] + [text for text, _ in SENTENCES]
    assert len(texts) >= 200
    assert len(set(texts)) == len(texts)


@pytest.mark.parametrize(("text", "expected"), CASES, ids=[text for text, _ in CASES])
def test_a_listener_hears(text: str, expected: str) -> None:
    assert normalize_text(text) == expected


@pytest.mark.parametrize(("text", "chunks"), SENTENCES, ids=[text for text, _ in SENTENCES])
def test_sentences_split_only_where_they_end(text: str, chunks: list[str]) -> None:
    assert split_sentences(normalize_text(text)) == chunks
