# ruff: noqa: E501  (the problems are data: one line each)
"""Writes prl_actors/tasks/data/math_sample.jsonl: GSM8K-style word problems written for prl-actors.

Each problem lists its solution steps as (text, expression); the script evaluates every expression,
writes the worked solution GSM8K-style ("... 3*12 = 36 ...\n#### 36") and checks that the final
step's value is an integer. Run: python tools/make_math_sample.py
"""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

PROBLEMS: list[tuple[str, list[tuple[str, str]]]] = [
    (
        "Maya buys 3 packs of pens. Each pack holds 12 pens. She gives 7 pens to her brother. How many pens does she have left?",
        [("Maya buys", "3*12"), ("After giving 7 away she has", "36-7")],
    ),
    (
        "A baker makes 48 muffins in the morning and half as many in the afternoon. How many muffins does he make in total?",
        [("In the afternoon he makes", "48/2"), ("In total he makes", "48+24")],
    ),
    (
        "Tom reads 15 pages a day. How many pages does he read in 2 weeks?",
        [("Two weeks have", "2*7"), ("He reads", "15*14")],
    ),
    (
        "A farmer has 5 rows of apple trees with 18 trees in each row. He sells 23 trees. How many trees are left?",
        [("He has", "5*18"), ("After selling he has", "90-23")],
    ),
    (
        "Lena earns $14 an hour. She works 6 hours on Monday and 9 hours on Tuesday. How many dollars does she earn?",
        [("She works", "6+9"), ("She earns", "14*15")],
    ),
    (
        "A box holds 24 crayons. A teacher needs 150 crayons for her class. How many boxes must she buy?",
        [("Six boxes hold", "6*24"), ("which is short by", "150-144"), ("so she needs one more box: boxes =", "6+1")],
    ),
    (
        "A movie ticket costs $9 and popcorn costs $4. How much do 4 friends pay if each buys a ticket and popcorn?",
        [("Each friend pays", "9+4"), ("Together they pay", "13*4")],
    ),
    (
        "Sam had 120 marbles. He lost a quarter of them and then bought 35 more. How many marbles does he have now?",
        [("He lost", "120/4"), ("He then had", "120-30"), ("After buying more he has", "90+35")],
    ),
    (
        "A train travels at 80 km per hour for 3 hours and then at 60 km per hour for 2 hours. How many kilometres does it travel?",
        [("First part:", "80*3"), ("Second part:", "60*2"), ("In total:", "240+120")],
    ),
    ("Priya saves $25 every week. How many weeks does she need to save $400?", [("She needs", "400/25")]),
    (
        "A school has 4 classes of 28 students and 3 classes of 31 students. How many students are there?",
        [("The first classes have", "4*28"), ("The other classes have", "3*31"), ("In total there are", "112+93")],
    ),
    (
        "A shirt costs $40. It is on sale for 25% off. What is the sale price in dollars?",
        [("The discount is", "40*25/100"), ("The sale price is", "40-10")],
    ),
    (
        "Jon runs 3 miles on weekdays and 5 miles on each weekend day. How many miles does he run in a week?",
        [("On weekdays he runs", "3*5"), ("On the weekend he runs", "5*2"), ("In a week he runs", "15+10")],
    ),
    (
        "A garden is 12 meters long and 9 meters wide. What is its perimeter in meters?",
        [("The perimeter is", "2*(12+9)")],
    ),
    (
        "There are 36 cookies shared equally among 4 children. Each child eats 5 of their cookies. How many cookies does each child have left?",
        [("Each child gets", "36/4"), ("After eating 5 each has", "9-5")],
    ),
    (
        "A library had 1,250 books. It bought 340 more and gave away 95. How many books does it have now?",
        [("After buying it had", "1250+340"), ("After giving away it has", "1590-95")],
    ),
    (
        "Ana is 3 times as old as her son. Her son is 11. How old will Ana be in 5 years?",
        [("Ana is", "3*11"), ("In 5 years she will be", "33+5")],
    ),
    (
        "A pizza is cut into 8 slices. A party orders 7 pizzas and 45 slices are eaten. How many slices are left?",
        [("There are", "7*8"), ("Left over:", "56-45")],
    ),
    (
        "Ben buys 6 notebooks at $3 each and 2 backpacks at $27 each. How much does he spend in dollars?",
        [("Notebooks cost", "6*3"), ("Backpacks cost", "2*27"), ("He spends", "18+54")],
    ),
    (
        "A tank holds 500 liters. It is 40% full. How many more liters are needed to fill it?",
        [("It holds now", "500*40/100"), ("It needs", "500-200")],
    ),
    (
        "Mia has 3 dogs. Each dog eats 2 cups of food a day. A bag has 84 cups. How many days does a bag last?",
        [("The dogs eat per day", "3*2"), ("A bag lasts", "84/6")],
    ),
    ("A car uses 1 liter of fuel every 12 km. How many liters does it use for a 276 km trip?", [("It uses", "276/12")]),
    (
        "Leo scored 78, 85 and 92 on three tests. What is his average score?",
        [("His total is", "78+85+92"), ("His average is", "255/3")],
    ),
    (
        "A store sells apples at 6 for $2. How many dollars do 42 apples cost?",
        [("42 apples are this many groups of 6:", "42/6"), ("They cost", "7*2")],
    ),
    (
        "A bus has 52 seats. 19 people get on at the first stop and 26 at the second. How many seats are still free?",
        [("People on the bus:", "19+26"), ("Free seats:", "52-45")],
    ),
    (
        "Eva knits 4 scarves a week. Each scarf needs 3 balls of yarn at $5 per ball. How much does she spend on yarn in 3 weeks?",
        [("She knits", "4*3"), ("She needs balls of yarn:", "12*3"), ("She spends", "36*5")],
    ),
    (
        "A rope is 15 meters long. It is cut into pieces of 60 centimeters. How many pieces are there?",
        [("The rope is this many centimeters:", "15*100"), ("Pieces:", "1500/60")],
    ),
    (
        "Kai has $200. He spends a fifth on a game and $35 on shoes. How many dollars are left?",
        [("The game costs", "200/5"), ("He spends in total", "40+35"), ("He has left", "200-75")],
    ),
    (
        "A phone plan costs $18 a month plus a $30 activation fee. What is the cost for the first year?",
        [("Twelve months cost", "18*12"), ("With the fee:", "216+30")],
    ),
    (
        "Three friends split a $126 dinner bill equally and each adds a $6 tip. How much does each friend pay?",
        [("Each share of the bill is", "126/3"), ("With the tip each pays", "42+6")],
    ),
    (
        "A factory makes 250 toys a day and packs them in boxes of 10. How many boxes does it fill in 5 days?",
        [("It makes", "250*5"), ("It fills", "1250/10")],
    ),
    (
        "Rosa walks 2 km to school and back every school day. How many km does she walk in 20 school days?",
        [("Each day she walks", "2*2"), ("In 20 days she walks", "4*20")],
    ),
    (
        "A jar has 60 candies: 1/3 are red and 1/4 are green, the rest are yellow. How many are yellow?",
        [("Red:", "60/3"), ("Green:", "60/4"), ("Yellow:", "60-20-15")],
    ),
    (
        "A plumber charges $50 to come out plus $35 per hour. What does a 4-hour job cost in dollars?",
        [("The hours cost", "35*4"), ("The job costs", "50+140")],
    ),
    (
        "Nina planted 8 rows of 14 tulips. Of these, 16 tulips did not bloom. How many bloomed?",
        [("She planted", "8*14"), ("Bloomed:", "112-16")],
    ),
    (
        "The temperature was -4 degrees in the morning and rose by 11 degrees by noon. What was it at noon?",
        [("At noon it was", "-4+11")],
    ),
    (
        "A recipe needs 250 grams of flour for 10 pancakes. How many grams are needed for 36 pancakes?",
        [("Per pancake:", "250/10"), ("For 36 pancakes:", "25*36")],
    ),
    (
        "Omar buys 2 kg of rice at $3 per kg and pays with a $20 bill. How much change does he get in dollars?",
        [("The rice costs", "2*3"), ("His change is", "20-6")],
    ),
    (
        "A cinema has 15 rows of 22 seats. 280 tickets are sold. How many seats are empty?",
        [("Seats:", "15*22"), ("Empty:", "330-280")],
    ),
    (
        "Grace types 45 words per minute. How many minutes does she need for a 1,800-word essay?",
        [("She needs", "1800/45")],
    ),
]


def solve(steps: list[tuple[str, str]]) -> tuple[str, Fraction]:
    lines, value = [], Fraction(0)
    for text, expr in steps:
        value = Fraction(eval(expr, {"__builtins__": {}}, {})).limit_denominator()  # our own literals only
        shown = str(value.numerator) if value.denominator == 1 else str(float(value))
        lines.append(f"{text} {expr} = {shown}.")
    return "\n".join(lines), value


def main() -> None:
    out = Path(__file__).resolve().parent.parent / "prl_actors/tasks/data/math_sample.jsonl"
    with out.open("w") as f:
        for question, steps in PROBLEMS:
            solution, value = solve(steps)
            assert value.denominator == 1, (question, value)
            f.write(json.dumps({"question": question, "answer": f"{solution}\n#### {value.numerator}"}) + "\n")
    print(f"wrote {len(PROBLEMS)} problems to {out}")


if __name__ == "__main__":
    main()
